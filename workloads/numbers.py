"""Reading a number the one way every input is read: a flag's text, a trace's cell, a TOML, JSON
or Python value.

A number is a finite decimal written in ASCII (``12``, ``0.5``, ``-3e-2``; not ``1_000`` nor
another script's digits, which Python would read: inputs are data from elsewhere, so no
guessing). NaN is never one: a blank is how a file says "not given", and a NaN that slipped in
would otherwise be taken for "not given" or poison a sum. An infinity is refused too, except
where a setting gives it a documented meaning (``--rate inf``: every request at t = 0, as
``vllm bench serve --request-rate inf``); there only the words ``inf``/``infinity`` say it,
never a decimal too large for a float.
"""

from __future__ import annotations

import math
import re
from typing import Any

DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
INFINITY_WORDS = ("inf", "+inf", "infinity", "+infinity")
NON_FINITE_WORDS = ("nan", "inf", "infinity")  # with any sign, in any case


class NotFinite(ValueError):
    """A number, but NaN or an infinity where none is meaningful."""


def read_number(raw: Any, *, infinite: bool = False) -> float:
    """``raw`` as a float; ValueError with the line the user reads (after the field's name) when it
    is not a number, :class:`NotFinite` when it is NaN or an infinity (+inf passes where ``infinite``)."""
    if isinstance(raw, str):
        text = raw.strip()
        if infinite and text.lower() in INFINITY_WORDS:
            return math.inf
        if text.lower().lstrip("+-") in NON_FINITE_WORDS:
            raise NotFinite(f"'{text}' is not a finite number")
        if not DECIMAL.fullmatch(text):
            ascii_only = "" if text.isascii() else " (ASCII digits only)"
            raise ValueError(f"'{text}' is not a number{ascii_only}")
        value = float(text)
    elif isinstance(raw, bool):
        raise ValueError(f"'{raw}' is not a number")
    else:
        try:
            value = float(raw)
        except OverflowError:  # an integer beyond any float
            raise NotFinite(f"'{raw}' is not a finite number") from None
        except (TypeError, ValueError):
            raise ValueError(f"'{raw}' is not a number") from None
        if infinite and value == math.inf:
            return value
    if not math.isfinite(value):
        raise NotFinite(f"'{raw}' is not a finite number")
    return value
