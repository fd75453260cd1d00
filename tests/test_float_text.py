"""sim/float_text.py: a float64's shortest round-trip text, byte for byte as pyarrow prints it.

The compiled CSV rows (sim/csv_rows.py) print every float of a long table this way; pyarrow's cast to
strings (double-conversion) is the oracle: the same digits (the shortest that read back as the float, the
nearest of those) and the same layout (plain decimals for decimal exponents -6 to 9, else ``1.5e+20``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import csv_rows, jit


def pyarrow_text(values: np.ndarray) -> bytes:
    import pyarrow.compute as pc

    return "".join(f"{text}\n" for text in pc.cast(pa.array(values), pa.string()).to_pylist()).encode()


def our_text(values: np.ndarray, compiled: bool = True) -> bytes:
    """The values as the compiled rows print a one-column table of them (a repeat above is reused, as in a run)."""
    format_rows = jit.compiled(csv_rows.format_rows) if compiled else csv_rows.format_rows
    return csv_rows.csv_rows({"x": np.ascontiguousarray(values, np.float64)}, 0, len(values), {}, format_rows).tobytes()


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**64 - 1, 300_000, dtype=np.uint64, endpoint=True)
    every = bits.view(np.float64)
    return {
        "any bit pattern": every[~np.isnan(every)],  # subnormals, both signs, every exponent
        "times": np.cumsum(rng.exponential(0.05, 100_000)),  # a run's clock: 17 significant digits
        "tiny and huge": rng.standard_normal(50_000) * 10.0 ** rng.integers(-320, 300, 50_000),
        "whole numbers": rng.integers(-10**17, 10**17, 50_000).astype(np.float64),
        "short decimals": rng.integers(0, 10**7, 50_000) / 1000.0,
        "decimal and exponent edges": np.array([float(f"{m}e{e}") for e in range(-12, 24)
                                                for m in (1, 9.5, 9.999999999999999, 1.2345678901234567)]),
        "powers of two and their neighbours": np.concatenate([np.ldexp(1.0, np.arange(-1074, 1024)),
                                                              np.nextafter(np.ldexp(1.0, np.arange(-1073, 1024)), 0),
                                                              np.nextafter(np.ldexp(1.0, np.arange(-1074, 1023)), np.inf)]),
        "special": np.array([0.0, -0.0, np.inf, -np.inf, 5e-324, -5e-324, 2.2250738585072014e-308,
                             2.225073858507201e-308, 1.7976931348623157e308, -1.7976931348623157e308, 1e23,
                             9007199254740993.0, 0.1, 0.3, 1 / 3, 2 / 3, 1e-7, 1e-6, 9.999999999999999e9, 1e10]),
    }


CASES = _cases()


@pytest.mark.parametrize("case", list(CASES))
def test_the_text_is_pyarrows(case):
    values = CASES[case]
    assert our_text(values) == pyarrow_text(values)


def test_the_plain_functions_print_what_the_compiled_ones_do():
    """Interpreted (engine.jit = off's numpy scalars), the same functions give the same bytes."""
    values = np.concatenate([array[:: max(1, len(array) // 40)] for array in CASES.values()])
    assert our_text(values, compiled=False) == our_text(values) == pyarrow_text(values)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False))
def test_any_float_reads_back_as_itself(value):
    text = our_text(np.array([value, value, -value]))
    first, repeat, negated = text.decode().splitlines()
    assert first == repeat and np.float64(first).tobytes() == np.float64(value).tobytes()  # -0.0 too
    assert np.float64(negated).tobytes() == np.float64(-value).tobytes()
    assert text == pyarrow_text(np.array([value, value, -value]))


def test_the_longest_texts_fit_the_rows_room():
    """Negative, just above 1e-6, with 17 digits: 25 bytes, the longest text (``LONGEST``). The plain
    function, checked by numpy, fails on a row that would overrun the room sized from it."""
    values = -(1 + np.random.default_rng(2).random(300)) * 1e-6
    assert {len(line) for line in pyarrow_text(values).splitlines()} >= {25}
    assert our_text(values, compiled=False) == pyarrow_text(values) == our_text(values)


def test_the_benchmark_prints_a_line_a_kind():
    """benchmarks/float_text_speed.py, which docs/performance.md quotes, runs and prints each kind's times."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "float_text_speed.py"
    done = subprocess.run([sys.executable, str(script), "--values", "3000", "--repeats", "1"], capture_output=True,
                          text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].split()[:1] == ["values"] and len(lines) == 4
    assert all(line.count(" ns") == 2 and line.endswith("x") for line in lines[1:]), lines
