"""Command-line flags shared by the commands: the ``specbatch run`` flags, derived from the config's
key table (``sim.config.KEYS``), and argparse conversion that fails with one line.

``run``, ``validate``, ``replay`` and ``capacity`` take (some of) the run flags; a sweep axis or
an API keyword may be named like a flag. A setting added to the table is a flag everywhere, and
so is the rule that one command names each setting once (:func:`one_name_per_setting`).
"""

from __future__ import annotations

import argparse
import tomllib
from typing import Any, Callable, Iterable

from sim.config import KEY_BY_NAME, KEYS, Key
from sim.errors import InputError
from workloads.numbers import NotFinite, read_number

# flag -> (config key, type of its text, help); in the key table's order.
RUN_FLAGS: dict[str, tuple[str, type, str]] = {
    key.flag: (key.name, key.value.flag_type if key.value is not None else key.flag_type or str, key.help)
    for key in KEYS if key.flag is not None
}

# The flags that say how a run speculates: the method (vLLM's speculative_config, SGLang's flags) and its
# acceptance model. Commands that take a scenario but not all of the run flags take these whole.
SPECULATION_FLAGS: tuple[str, ...] = tuple(flag for flag, (key, _, _) in RUN_FLAGS.items()
                                           if key.startswith(("speculative.", "acceptance.")))

SEVERAL_WORDS = frozenset({"--goodput"})  # as vllm bench serve takes it: --goodput ttft:500 tpot:50
FLAG_ALIASES: dict[str, tuple[str, ...]] = {key.flag: key.aliases for key in KEYS if key.aliases}


def spellings(key: Key) -> tuple[str, ...]:
    """Every flag that sets ``key``: its flag, its aliases (vLLM's names), and for a true/false
    setting the ``--no-`` form of each (argparse's BooleanOptionalAction)."""
    names = (key.flag, *key.aliases) if key.flag is not None else ()
    if key.value is not None and key.value.type is bool:
        names += tuple(f"--no-{name[2:]}" for name in names)
    return names


SETTING_OF: dict[str, str] = {name: key.name for key in KEYS for name in spellings(key)}  # flag -> config key


def one_name_per_setting(names: Iterable[str], as_flag: Callable[[str], str] = lambda name: name) -> None:
    """Refuse one command naming a setting twice, in two spellings (``--request-rate 12 --rate 5``,
    ``num_prompts=`` and ``num_requests=``): which one was meant would be a guess, so the line names
    both. The same spelling repeated is argparse's last-wins, and a flag beside its TOML key is
    the documented override. ``as_flag`` maps a name as given (an API keyword) to its flag."""
    first: dict[str, str] = {}
    for name in names:
        key = SETTING_OF.get(as_flag(name))
        if key is not None and first.setdefault(key, name) != name:
            raise InputError(f"{first[key]} and {name} both set {key}: give one of them")


def flag_names(argv: Iterable[str]) -> list[str]:
    """The flags on a command line, as spelled (``--rate=5`` is ``--rate``), up to a ``--``."""
    names = []
    for token in argv:
        if token == "--":
            break
        if token.startswith("--"):
            names.append(token.split("=", 1)[0])
    return names


def typed(flag: str, kind: type, infinite: bool = False):
    """An argparse ``type`` converting a flag's text with ``kind`` (int, float, str); a bad text is
    argparse's one-line usage error, before any work. A float is read as every number is
    (:func:`workloads.numbers.read_number`): never NaN, and an infinity only where ``infinite``
    (a setting that gives it a meaning, such as ``--rate inf``)."""
    def convert(text: str):
        if kind in (int, float) and not text.isascii():  # Python reads other scripts' digits as numbers
            raise argparse.ArgumentTypeError(f"'{text}' is not a valid {kind.__name__} (ASCII digits only)")
        try:
            return read_number(text, infinite=infinite) if kind is float else kind(text)
        except NotFinite as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a valid {kind.__name__}") from None
    convert.__name__ = kind.__name__
    return convert


def add_run_flags(parser: argparse.ArgumentParser, flags: list[str] | None = None,
                  helps: dict[str, str] | None = None) -> None:
    """Add run flags (all, or those named) whose values land in ``args`` under their config keys."""
    for flag in flags or list(RUN_FLAGS):
        key, kind, text = RUN_FLAGS[flag]
        names = (flag, *FLAG_ALIASES.get(flag, ()))
        if kind is bool:  # --chunked-prefill / --no-chunked-prefill
            parser.add_argument(*names, dest=key, action=argparse.BooleanOptionalAction, default=None,
                                help=(helps or {}).get(flag, text))
            continue
        words = {"nargs": "+"} if flag in SEVERAL_WORDS else {}
        value = KEY_BY_NAME[key].value
        convert = typed(flag, kind, infinite=value is not None and value.infinite)
        parser.add_argument(*names, dest=key, type=convert, default=None, help=(helps or {}).get(flag, text), **words)


def run_overrides(args: argparse.Namespace, flags: list[str] | None = None) -> dict[str, tuple]:
    """The run flags' values as load_config overrides: config key -> (value or None, flag).

    ``--policy NAME:KEY=VALUE:...`` becomes the policy's name and parameters (:func:`policy_spec`)."""
    overrides = {RUN_FLAGS[f][0]: (getattr(args, RUN_FLAGS[f][0], None), f) for f in flags or list(RUN_FLAGS)}
    name, flag = overrides.get("policy.name", (None, None))
    if isinstance(name, str):
        del overrides["policy.name"]
        overrides.update(policy_overrides(name, flag))
    return overrides


# ------------------------------------------------------------------ the one policy syntax
def split_outside(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` where it is not inside brackets, braces or quotes (JSON and TOML values
    keep their colons and commas)."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def policy_spec(text: str, source: str) -> tuple[str, dict[str, Any]]:
    """``lut:alpha=0.7``, ``goodput:k_max=6``, ``my.module:MyPolicy:rate=2`` -> (name, parameters).

    Pieces are separated by ':' (outside brackets and quotes); those with '=' are KEY=VALUE, the
    rest form the name (so ``module:Class`` stays whole). A value is read as TOML (``0.7``, ``true``,
    ``[[1, 4, 3]]``, ``"text"``), else kept as text (a bare word, a file name, JSON). The same
    syntax in ``run``, ``sweep``, ``capacity``, ``regress`` and the Python API."""
    names, params = [], {}
    for piece in split_outside(text.strip(), ":"):
        key, sep, value = piece.partition("=")
        if sep and split_outside(piece, "=")[0] == key:
            key, value = key.strip(), value.strip()
            if not key or not value:
                raise InputError(f"'{piece}' in policy '{text}' is not KEY=VALUE", source=source)
            if key == "name" or key in params:
                raise InputError(f"policy '{text}' gives '{key}' twice", source=source)
            params[key] = _value(value)
        else:
            names.append(piece.strip())
    if not names or not all(names):
        raise InputError(f"'{text}' has no policy name (NAME or NAME:KEY=VALUE:...)", source=source)
    return ":".join(names), params


def policy_overrides(text: str, source: str) -> dict[str, tuple[Any, str]]:
    """A policy spec as load_config overrides, each sourced where it was given."""
    name, params = policy_spec(text, source)
    return {"policy.name": (name, source), **{f"policy.{key}": (value, source) for key, value in params.items()}}


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
