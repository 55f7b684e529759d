"""The ``ucstage`` command: one module per subcommand, one renderer (output.py)."""

from .app import cli, main

__all__ = ["cli", "main"]
