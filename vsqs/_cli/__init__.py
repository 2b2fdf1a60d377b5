"""The ``vsqs`` command line (an adapter over the public API)."""

from vsqs._cli.commands import main

__all__ = ["main"]
