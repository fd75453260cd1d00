"""``specbatch replay``: serve a scenario for real and write what it measured (see :mod:`sim.commands.validation`)."""

from sim.commands.validation import add_replay_arguments as add_arguments
from sim.commands.validation import replay_main as main

__all__ = ["add_arguments", "main"]
