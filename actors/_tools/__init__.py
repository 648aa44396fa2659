"""Tools: the `@tool` decorator, argument validation, the per-call context, result conversion."""
