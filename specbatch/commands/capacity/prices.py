"""Which GPU a profile's costs are for, and what an hour of it costs.

No prices ship with specbatch: hourly GPU prices differ several-fold between
providers, regions and commitments, and change month to month, so a built-in
number would silently decide a cross-GPU comparison and go stale. The user gives
them, per GPU (``--gpu-price h100=3.9,h200=4.5`` or a TOML file of ``GPU = PRICE``
lines), and the report prints the price each profile was costed at.

A price key names a GPU loosely: it matches a profile when every word of the key
(letters and digits, split at anything else, case-insensitive) is a word of the
profile's device description, so ``h100`` matches a composed ``h100_sxm`` and a
measured ``NVIDIA H100 80GB HBM3`` alike, while ``h20`` does not match ``h200``.
When several keys match, the most specific one (most words) wins.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

from sim.errors import InputError, missing_file, read_text

FLAG = "--gpu-price"


def profile_gpu(meta: dict[str, Any]) -> str:
    """The GPU (or other device) a profile's costs were composed or measured for.

    Composed profiles (``source = "composed"``) name it in a ``gpu`` field, the kernel
    data's system name such as ``h100_sxm`` (top level, in ``device`` or in ``composition``); measured
    ones in ``device.name`` as torch reports it (``NVIDIA H100 80GB HBM3``, or the CPU's
    name). The device type (``cuda``, ``cpu``) is the last resort.
    """
    descriptions = _descriptions(meta)
    return descriptions[0] if descriptions else "unknown device"


def _descriptions(meta: dict[str, Any]) -> list[str]:
    device = meta.get("device") if isinstance(meta.get("device"), dict) else {}
    composition = meta.get("composition") if isinstance(meta.get("composition"), dict) else {}
    found = [meta.get("gpu"), device.get("gpu"), composition.get("gpu"), device.get("name"), device.get("type")]
    return [text.strip() for text in found if isinstance(text, str) and text.strip()]


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def parse_gpu_prices(text: str) -> dict[str, float]:
    """``h100=3.9,h200_sxm=4.5`` or the path of a TOML file of ``GPU = PRICE`` lines -> {key: $/GPU-hour}."""
    if "=" in text:
        prices: dict[str, float] = {}
        for item in (part.strip() for part in text.split(",")):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise InputError(f"'{item}' is not GPU=PRICE, e.g. h100=3.9", source=FLAG)
            _add(prices, key.strip(), _price(value.strip(), key.strip(), FLAG, None))
        return prices
    path = Path(text)
    if not path.is_file():
        why = missing_file(path, "TOML file of prices") if path.is_dir() else \
            "is neither GPU=PRICE pairs (h100=3.9,h200=4.5) nor a TOML file"
        raise InputError(f"'{text}' {why}", source=FLAG)
    source = f"{FLAG} {path}"
    body = read_text(path, field=FLAG)
    try:
        table = tomllib.loads(body)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise InputError(f"not valid TOML: {str(exc).split(' (at')[0]}", source=source,
                         line=int(match.group(1)) if match else None) from None
    if not table:
        raise InputError("no prices: write one GPU = PRICE line per GPU, e.g. h100 = 3.9", source=source)
    prices = {}
    for key, value in table.items():
        line = _line_of(body, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"expected a price per GPU-hour (a number), got {value!r}", source=source, line=line,
                             field=key)
        _add(prices, key, _price(value, key, source, line))
    return prices


def _price(value: Any, key: str, source: str, line: int | None) -> float:
    try:
        price = float(value)
    except ValueError:
        raise InputError(f"'{value}' for {key} is not a price", source=source, line=line) from None
    if not (math.isfinite(price) and price > 0):
        raise InputError(f"the price of {key} must be a positive number per GPU-hour, got {value}",
                         source=source, line=line)
    return price


def _add(prices: dict[str, float], key: str, price: float) -> None:
    if not _words(key):
        raise InputError(f"'{key}' names no GPU", source=FLAG)
    same = [other for other in prices if _words(other) == _words(key)]
    if same:
        raise InputError(f"{key} is given twice ('{same[0]}' and '{key}')", source=FLAG)
    prices[key] = price


def _line_of(text: str, key: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if re.match(rf'^\s*["\']?{re.escape(key)}["\']?\s*=', line):
            return number
    return None


def gpu_price(meta: dict[str, Any], prices: dict[str, float], profile: str) -> tuple[str, float]:
    """(the key that priced it, $ per GPU-hour) for a profile; one InputError naming the flag when none fits."""
    words = frozenset().union(*(_words(d) for d in _descriptions(meta)))
    matches = [key for key in prices if _words(key) <= words]
    gpu = profile_gpu(meta)
    if not matches:
        given = ", ".join(prices) or "none"
        raise InputError(f"no price for the GPU of profile {profile} ('{gpu}'); prices given for: {given}; "
                         f"add one, e.g. {FLAG} {_example_key(gpu)}=PRICE", source=FLAG)
    best = max(len(_words(key)) for key in matches)
    top = [key for key in matches if len(_words(key)) == best]
    if len(top) > 1:
        raise InputError(f"'{top[0]}' and '{top[1]}' both match the GPU of profile {profile} ('{gpu}'); "
                         f"keep one", source=FLAG)
    return top[0], prices[top[0]]


def _example_key(gpu: str) -> str:
    return "_".join(re.findall(r"[a-z0-9]+", gpu.lower())) or "gpu"
