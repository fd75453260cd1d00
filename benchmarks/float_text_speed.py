"""How fast a long table's floats are printed: sim/float_text.py (compiled Ryu) against pyarrow's cast.

    python benchmarks/float_text_speed.py                 # 1M values of each kind, best of 5
    python benchmarks/float_text_speed.py --values 200000 --repeats 9

Both give the same bytes (tests/test_float_text.py); this prints what each takes a value, in this
process, best of ``--repeats`` (the machine's noise only ever slows a call down):

* ``ours``: one float column through sim/csv_rows.py's compiled row formatter, as a run's tables
  are written (each value its own row: the digits, their layout, the line break);
* ``pyarrow cast``: pyarrow's cast of the same values to strings (double-conversion), which the
  formatter used before, and which then still had to be copied into the rows.

The kinds: a run's clock (the running sum of exponential gaps, as arrival and finish times are:
17 significant digits), per-step means of tokens (a few digits after the point), and random bit
patterns (every exponent, both signs, subnormals). The first call compiles or loads the compiled
formatter; it is not timed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def kinds(count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**63, count, dtype=np.uint64) | (rng.integers(0, 2, count, dtype=np.uint64) << np.uint64(63))
    random_bits = bits.view(np.float64)
    return {"a run's clock": np.cumsum(rng.exponential(0.05, count)),
            "mean tokens": rng.integers(1, 10**6, count) / rng.integers(1, 64, count),
            "random bit patterns": random_bits[~np.isnan(random_bits)]}


def best(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=1_000_000, help="values of each kind (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=5, help="calls timed, the best kept (default 5)")
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.compute as pc

    from sim import csv_rows, jit

    format_rows = jit.compiled(csv_rows.format_rows)
    csv_rows.csv_rows({"x": np.zeros(2)}, 0, 2, {}, format_rows)  # compiled or loaded: not timed
    print(f"{'values':<22} {'ours':>12} {'pyarrow cast':>14}  ratio")
    for name, values in kinds(args.values).items():
        table = {"x": values}
        ours = best(lambda: csv_rows.csv_rows(table, 0, values.shape[0], {}, format_rows), args.repeats)
        array = pa.array(values)
        theirs = best(lambda: pc.cast(array, pa.string()), args.repeats)
        per = 1e9 / values.shape[0]
        print(f"{name:<22} {ours * per:>9.0f} ns {theirs * per:>11.0f} ns  {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
