"""An engine's knob as the engine takes it: a table (TOML or Python), JSON text, or a JSON file.

The engine policies (``vllm-dynamic``, ``sglang-adaptive``, ``trtllm-schedule``) accept the
knob a user already has: vLLM's ``--speculative-config`` is JSON text, SGLang's
``--speculative-adaptive-config`` names a JSON file, TensorRT-LLM's ``draft_len_schedule``
is a Python dict. So a string that starts with ``{`` or ``[`` is read as JSON and any other
string as the path of a JSON file (a Python dict literal such as ``{4: 4, 8: 2}`` is read
too); a mapping or list is taken as it is.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
from pathlib import Path
from typing import Any

from policies.base import PolicyError


def load_knob(value: Any, param: str, kinds: tuple[type, ...] = (dict,)) -> Any:
    """The knob's value, parsed if it is text; PolicyError naming ``param`` if it is not one of ``kinds``."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "["):
            where = "its JSON"
        else:
            where = f"the JSON file {text}"
            try:
                text = Path(text).read_text()
            except OSError as exc:
                raise PolicyError(f"{param}: cannot read the JSON file '{value}': {exc.strerror or exc}",
                                  field=param) from None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            value = _literal(text)  # TensorRT-LLM's Python dict, {4: 4, 8: 2}, is not JSON
            if value is None:
                raise PolicyError(f"{param}: {where} is not valid JSON ({exc.msg} at line {exc.lineno}, "
                                  f"column {exc.colno})", field=param) from None
    if not isinstance(value, kinds):
        names = " or ".join("a JSON object" if k is dict else "a JSON list" for k in kinds)
        raise PolicyError(f"{param} must be {names} (or JSON text, or a JSON file's path), got {value!r}",
                          field=param)
    return value


@contextlib.contextmanager
def named(policy: str):
    """Errors raised inside name the policy first: "vllm-dynamic: speculative_config ..."."""
    try:
        yield
    except PolicyError as exc:
        raise PolicyError(f"{policy}: {exc.message}", field=exc.field) from None


def _literal(text: str) -> Any:
    """A Python literal dict or list (numbers and strings only), else None."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, (dict, list)) else None


def whole(value: Any, what: str, param: str, lo: int = 0) -> int:
    """A whole number >= lo (a JSON 3.0 counts as 3); PolicyError naming ``param`` otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise PolicyError(f"{param}: {what} must be a whole number >= {lo}, got {value!r}", field=param)
    return value


def number(value: Any, what: str, param: str) -> float:
    """A finite number; PolicyError naming ``param`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PolicyError(f"{param}: {what} must be a number, got {value!r}", field=param)
    return float(value)


def batch_key(key: Any, param: str) -> int:
    """A batch-size key of a JSON or TOML table (keys are text there: "64" is 64)."""
    if isinstance(key, str) and key.strip().isdigit():
        key = int(key.strip())
    return whole(key, f"the batch-size key {key!r}", param, lo=1)
