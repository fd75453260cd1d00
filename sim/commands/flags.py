"""Command-line flags shared by the commands: the ``specbatch run`` flags, derived from the config's
key table (``sim.config.KEYS``), and argparse conversion that fails with one line.

``run``, ``validate``, ``replay`` and ``capacity`` take (some of) the run flags; a sweep axis or
an API keyword may be named like a flag. A setting added to the table is a flag everywhere.
"""

from __future__ import annotations

import argparse

from sim.config import KEYS

# flag -> (config key, type of its text, help); in the key table's order.
RUN_FLAGS: dict[str, tuple[str, type, str]] = {
    key.flag: (key.name, key.value.flag_type if key.value is not None else key.flag_type or str, key.help)
    for key in KEYS if key.flag is not None
}


def typed(flag: str, kind: type):
    """An argparse ``type`` converting a flag's text with ``kind`` (int, float, str); a bad text is
    argparse's one-line usage error, before any work."""
    def convert(text: str):
        if kind in (int, float) and not text.isascii():  # Python reads other scripts' digits as numbers
            raise argparse.ArgumentTypeError(f"'{text}' is not a valid {kind.__name__} (ASCII digits only)")
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a valid {kind.__name__}") from None
    convert.__name__ = kind.__name__
    return convert


def add_run_flags(parser: argparse.ArgumentParser, flags: list[str] | None = None,
                  helps: dict[str, str] | None = None) -> None:
    """Add run flags (all, or those named) whose values land in ``args`` under their config keys."""
    for flag in flags or list(RUN_FLAGS):
        key, kind, text = RUN_FLAGS[flag]
        parser.add_argument(flag, dest=key, type=typed(flag, kind), default=None, help=(helps or {}).get(flag, text))


def run_overrides(args: argparse.Namespace, flags: list[str] | None = None) -> dict[str, tuple]:
    """The run flags' values as load_config overrides: config key -> (value or None, flag)."""
    return {RUN_FLAGS[f][0]: (getattr(args, RUN_FLAGS[f][0], None), f) for f in flags or list(RUN_FLAGS)}
