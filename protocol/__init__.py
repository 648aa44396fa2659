"""steerable.protocol: pure data that crosses a boundary."""
