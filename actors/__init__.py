"""steerable.actors: everything that runs."""
