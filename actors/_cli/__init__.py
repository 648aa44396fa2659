"""The `steerable` command line and its demo (the top layer: it may use every other part)."""

from .cli import main

__all__ = ["main"]
