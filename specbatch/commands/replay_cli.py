"""``specbatch replay``: serve a scenario for real and write what it measured (see :mod:`specbatch.commands.validation`)."""

from specbatch.commands.validation import add_replay_arguments as add_arguments
from specbatch.commands.validation import replay_main as main

__all__ = ["add_arguments", "main"]
