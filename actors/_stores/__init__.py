"""Checkpoint stores (in memory, SQLite) and the read-only replay of a stored run."""
