"""docs/figures/sweep.png: mean E2EL against rate per policy, from a sweep's table.

    python docs/figures/sweep_figure.py             # runs docs/examples/sweep/policies-vs-rate.toml (~20 s)
    python docs/figures/sweep_figure.py --table sweeps/policies-vs-rate/sweep.parquet   # an existing table

The line is the mean over seeds of each cell's mean E2EL; the band spans the seeds'
smallest to largest, so the spread a single seed would hide is visible.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specbatch.commands.cli import main as specbatch  # noqa: E402

HERE = Path(__file__).resolve().parent
SWEEP = HERE.parent / "examples" / "sweep" / "policies-vs-rate.toml"


def plot(table: pd.DataFrame, out: Path) -> None:
    ok = table[table.status == "ok"]
    stats = ok.groupby(["policy", "workload.rate"], sort=False).mean_e2el_ms.agg(["mean", "min", "max"]) / 1e3
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for policy in ok.policy.unique():  # the sweep file's order
        s = stats.loc[policy]
        ax.plot(s.index, s["mean"], marker="o", label=policy)
        ax.fill_between(s.index, s["min"], s["max"], alpha=0.2)
    seeds = ok.groupby(["policy", "workload.rate"]).size().max()
    ax.set(xlabel="request rate (req/s)", ylabel="mean E2EL (s)",
           title=f"Mean end-to-end latency vs load ({seeds} seeds: line = mean, band = min..max)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(title="policy")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--table", type=Path, default=None, help="plot this sweep table instead of running one")
    parser.add_argument("--out", type=Path, default=HERE / "sweep.png")
    args = parser.parse_args()
    if args.table is not None:
        plot(pd.read_parquet(args.table) if args.table.suffix == ".parquet" else pd.read_csv(args.table), args.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            code = specbatch(["sweep", str(SWEEP), "--out", tmp, "--no-progress"])
            if code != 0:
                return code
            plot(pd.read_parquet(Path(tmp) / "sweep.parquet"), args.out)
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
