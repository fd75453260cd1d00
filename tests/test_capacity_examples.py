"""The capacity reports the docs show are what the code gives today, and their answers hold.

* Each example's report (docs/capacity_examples.py writes them; the docs' tables are read
  from them) is rerun for one policy: its search must try the same rates with the same
  verdicts and find the same max rate, or the committed report is stale.
* The max rate never overstates the replica: at the reported rate a run ten times longer
  than the one that decided it keeps every SLO and a stable queue; 5% above it, it does
  not (on the shipped H100 profile and on the CPU example).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
H100 = "h100-llama-3.1-8b-llama-3.2-1b"


@pytest.fixture(scope="module")
def examples():
    yield load_script("docs/capacity_examples.py", "capacity_examples")
    sys.modules.pop("capacity_examples", None)


def committed(examples, name: str, profile: str | None, policy: str) -> dict:
    folder = ROOT / examples.EXAMPLES[name][0]
    doc = json.loads((folder / "capacity.json").read_text())
    return doc, doc["profiles"][profile or doc["profile_order"][0]]["policies"][policy]


def label_of(plan, profile: str | None, policy: str) -> str:
    return next(label for label, (name, pol) in plan.members.items()
                if pol == policy and (profile is None or name == profile))


@pytest.mark.slow
@pytest.mark.parametrize("name, profile, policy", [("cpu", None, "fixed"), ("cpu", None, "goodput"),
                                                   ("gpus", H100, "none")])
def test_the_committed_example_is_what_the_code_gives_today(examples, name, profile, policy):
    from specbatch.commands.capacity.search import search_capacity

    plan = examples.plan(name)
    label = label_of(plan, profile, policy)
    settings = replace(plan.inputs.settings, curve_points=0)  # the search's own points do not depend on the curves
    fresh = search_capacity({label: plan.configs[label]}, plan.inputs.slos, settings, jobs=1)[label]
    _, old = committed(examples, name, profile, policy)
    searched = [(p["rate_req_s"], p["verdict"], p["requests_per_seed"]) for p in old["points"] if not p["curve_point"]]
    again = [(rate, p.verdict, p.requests) for rate, p in fresh.points.items()]
    stale = f"docs report of '{name}' is stale: run python docs/capacity_examples.py {name} && python docs/generate.py"
    assert [v for _, v, _ in again] == [v for _, v, _ in searched], stale
    assert [n for _, _, n in again] == [n for _, _, n in searched], stale
    assert [r for r, _, _ in again] == pytest.approx([r for r, _, _ in searched], rel=1e-9), stale
    assert fresh.max_rate == pytest.approx(old["max_rate_req_s"], rel=1e-9), stale


def keeps(examples, name: str, profile: str | None, policy: str, rate: float, requests: int) -> tuple[bool, str]:
    """A run of ``requests`` at ``rate``: every SLO statistic within its limit and the queue not growing."""
    from specbatch.commands.capacity.search import pooled_stats, run_point
    from sim.stability import pooled_growth

    plan = examples.plan(name)
    config, slos = plan.configs[label_of(plan, profile, policy)], plan.inputs.slos
    run = run_point(config, rate, plan.inputs.settings.seeds[0], requests, plan.inputs.settings.warmup)
    stats, growth = pooled_stats([run], slos, rate), pooled_growth([run.growth])
    said = ", ".join(f"{s.metric} {stats[s.metric]:.4g} (limit {s.limit_ms:g})" for s in slos) + \
        f", queue {growth.verdict} ({growth.growth:.3g} req/s)"
    return all(stats[s.metric] <= s.limit_ms for s in slos) and not growth.grows, said


@pytest.mark.slow
@pytest.mark.parametrize("name, profile, policy", [("gpus", H100, "none"), ("cpu", None, "none"),
                                                   ("cpu", None, "fixed")])
def test_the_max_rate_holds_ten_times_longer_and_not_five_percent_above(examples, name, profile, policy):
    _, outcome = committed(examples, name, profile, policy)
    rate = outcome["max_rate_req_s"]
    decided = next(p["requests_per_seed"] for p in outcome["points"] if p["rate_req_s"] == rate)
    held, said = keeps(examples, name, profile, policy, rate, 10 * decided)
    assert held, f"at the reported {rate:.4g} req/s, ten times longer: {said}"
    above, said = keeps(examples, name, profile, policy, 1.05 * rate, 10 * decided)
    assert not above, f"5% above the reported {rate:.4g} req/s: {said}"
