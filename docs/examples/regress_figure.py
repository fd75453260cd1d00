"""Draw a ``specbatch regress --json`` comparison: each metric's relative change, coloured by verdict.

    specbatch regress --baseline tests/baselines/specbatch.toml --scenario goodput --policy fixed \
        --json comparison.json
    python docs/examples/regress_figure.py comparison.json docs/figures/regress.png

One panel per scenario (at most four); metrics that did not move are left out, so the
figure shows what a change did at a glance. Needs matplotlib (pip install -e ".[docs]").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLOURS = {"regressed": "#c0392b", "improved": "#27ae60", "changed": "#7f8c8d", "ok": "#bdc3c7"}


def draw(comparison: dict, out: Path, max_panels: int = 4) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    scenarios = [s["name"] for s in comparison["scenarios"]][:max_panels]
    moved = {name: [r for r in comparison["rows"] if r["scenario"] == name and r["verdict"] != "ok"]
             for name in scenarios}
    height = max([len(rows) for rows in moved.values()] + [1])
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.6 * len(scenarios), 0.2 * height + 1.3),
                             squeeze=False)
    for ax, name in zip(axes[0], scenarios):
        rows = moved[name][::-1]  # the table's order, top to bottom
        values = [100 * (r["rel_delta"] if r["rel_delta"] is not None else 0.0) for r in rows]
        ax.barh(range(len(rows)), values, color=[COLOURS[r["verdict"]] for r in rows])
        ax.set_yticks(range(len(rows)), [r["metric"] for r in rows], fontsize=7)
        ax.axvline(0, color="black", linewidth=0.6)
        ax.set_xlabel("change from baseline (%)")
        ax.set_title(f"{name}: {len(rows)} metrics moved", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    counts = comparison["counts"]
    fig.legend(handles=[Patch(color=COLOURS[v], label=f"{v} ({counts[v]})") for v in ("regressed", "improved",
                                                                                      "changed")],
               loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("comparison", type=Path, help="JSON written by specbatch regress --json")
    parser.add_argument("out", type=Path, help="PNG to write")
    args = parser.parse_args(argv)
    print(draw(json.loads(args.comparison.read_text()), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
