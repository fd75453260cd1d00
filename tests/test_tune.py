"""specbatch tune: the search space, the objective, the search, the trials store, the engine formats, the report.

Most tests run on the issue's GPU-like profile with linear costs (target 10 ms + 0.3 ms per
token of batch x q + 1 us per token of batch x context, the draft a tenth of it), small
scenarios and the serial executor, so the whole file runs in well under a minute.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.commands.cli import main
from specbatch.commands.tune.objective import GOODPUT, Objective, paired, parse_objective
from specbatch.commands.tune.search import CoordinateSearch
from specbatch.commands.tune.space import Space, batch_bands, context_bands, engine_policy, engine_text, fitted_bands
from specbatch.commands.tune.trials import same_run
from sim.errors import InputError
from tests.synthetic import make_profile

KV_PER_TOKEN_S = 1e-6


def linear_latency(phase: str, model: str, b: int, q: int, c: int = 0) -> float:
    """The issue's linear costs: t0 + c.b.q + kv.b.ctx for the target, a tenth of it for the draft."""
    scale = 1.0 if model == "target" else 0.1
    if phase == "verify":
        return 1e-5 * b * (q + 1)
    return scale * (0.010 + 3e-4 * b * q + KV_PER_TOKEN_S * b * c)


def make_linear_profile(directory: Path) -> Path:
    return make_profile(directory, linear_latency, batch=(1, 2, 4, 8, 16, 32, 64), q_max=8, draft_q_max=8,
                        label="linear-gpu", dtype="float16")


# The scenario: prompts ~256, outputs ~200 tokens, max batch 64, alpha 0.7.
SCENARIO = {"max_batch_size": 64, "prompt_tokens": "lognormal:256:0.5:1024", "output_tokens": "lognormal:200:0.5:1024",
            "alpha": 0.7}


@pytest.fixture(scope="session")
def linear_profile(tmp_path_factory) -> Path:
    return make_linear_profile(tmp_path_factory.mktemp("profiles") / "linear-gpu")


def flags(profile: Path, **extra) -> list[str]:
    out = ["--profile", str(profile)]
    for key, value in {**SCENARIO, **extra}.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


SMALL = {"rate": 2.5, "num_requests": 150, "k_max": 3, "bands": 3, "seeds": 2, "holdout_seeds": 2}


# ------------------------------------------------------------------ the space

def test_batch_bands_from_edges():
    assert batch_bands("4,16", 64) == ((1, 4), (5, 16), (17, 64))
    assert batch_bands([4, 16, 64], 64) == ((1, 4), (5, 16), (17, 64))
    with pytest.raises(InputError, match="--bands: edge 128 is above the engine's max batch size 64"):
        batch_bands([4, 128], 64)
    with pytest.raises(InputError, match="edges must increase"):
        batch_bands([8, 4], 64)
    with pytest.raises(InputError, match="not whole numbers"):
        batch_bands("4,x", 64)


def test_context_bands_hold_every_longer_context():
    bands = context_bands("1024,4096")
    assert bands[:2] == ((0, 1024), (1025, 4096)) and bands[2][0] == 4097


def test_fitted_bands_cut_at_the_lut_switches_then_split_the_busiest():
    steps = [0] * 65
    for b in range(20, 41):
        steps[b] = 10  # the decode steps fall on batch sizes 20..40
    # The switch at 30 stays; the busier band (1-30: 110 steps against 100) is split at its median.
    assert fitted_bands(steps, switches=[30], count=3) == ((1, 24), (25, 30), (31, 64))
    # Bands without steps (1-10, 51-64) are merged into their neighbours, not kept as wasted bands.
    assert fitted_bands(steps, switches=[10, 50], count=3) == ((1, 29), (30, 34), (35, 64))
    # Too many switches: the neighbours with the fewest steps merge.
    assert fitted_bands(steps, switches=[22, 25, 30, 35], count=3) == ((1, 25), (26, 35), (36, 64))


def test_fitted_bands_stop_when_nothing_separates():
    steps = [0] * 9
    steps[4] = 100  # every step at batch 4
    assert fitted_bands(steps, switches=[], count=5) == ((1, 8),)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=80), st.lists(st.integers(1, 90), max_size=6),
       st.integers(1, 10))
def test_fitted_bands_partition_the_batch_sizes(steps, switches, count):
    steps = [0] + steps
    bands = fitted_bands(steps, switches, count)
    max_batch = len(steps) - 1
    assert bands[0][0] == 1 and bands[-1][1] == max_batch
    assert all(lo <= hi for lo, hi in bands)
    assert all(b[1] + 1 == c[0] for b, c in zip(bands, bands[1:]))
    assert len(bands) <= max(count, 1)


def test_space_tables_merge_equal_neighbours_and_read_back():
    space = Space(((1, 4), (5, 16), (17, 64)), None, tuple(range(0, 5)))
    assert space.table((3, 3, 0)) == [[1, 16, 3], [17, 64, 0]]
    assert space.text((3, 3, 0)) == "1-16:3 17-64:0"
    assert space.policy((3, 2, 0)) == {"name": "lut", "table": [[1, 4, 3], [5, 16, 2], [17, 64, 0]]}
    assert space.project(lambda b: 4 if b <= 6 else 1) == (4, 1, 1)  # band 5-16: most of its sizes get 1
    steps = [0] * 65
    steps[5] = steps[6] = 10  # ... but most of its decode steps are at 5 and 6
    assert space.project(lambda b: 4 if b <= 6 else 1, steps) == (4, 4, 1)
    ctx = Space(((1, 8), (9, 64)), context_bands([1024]), (0, 1, 2))
    assert ctx.size == 4
    assert ctx.policy((2, 1, 2, 2))["table"][:2] == [[1, 8, 0, 1024, 2], [9, 64, 0, 1024, 1]]
    assert ctx.policy((2, 1, 2, 2))["table"][2][:4] == [1, 64, 1025, ctx.contexts[1][1]]


def test_engine_formats_and_where_an_engine_cannot_follow():
    space = Space(((1, 4), (5, 16), (17, 64)), None, tuple(range(0, 5)))
    assert json.loads(engine_text(space, (4, 2, 0), "vllm")) == {
        "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 16, 2], [17, 64, 0]]}
    assert engine_text(space, (4, 2, 0), "trtllm") == "{4: 4, 16: 2, 64: 0}"
    assert json.loads(engine_text(space, (4, 2, 1), "sglang")) == {"1": {"steps": [4]}, "5": {"steps": [2]},
                                                                    "17": {"steps": [1]}}
    with pytest.raises(InputError, match="SGLang drafts at least one step"):
        engine_text(space, (4, 2, 0), "sglang")
    ctx = Space(((1, 8), (9, 64)), context_bands([1024]), (0, 1, 2))
    with pytest.raises(InputError, match="context bands"):
        engine_text(ctx, (2, 1, 2, 2), "vllm")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True), st.data())
def test_every_format_gives_each_batch_size_its_bands_k(edges, data):
    """lut, vLLM, TensorRT-LLM (and SGLang where k >= 1) choose the schedule's k at every batch size."""
    from policies.base import BatchView
    from policies.registry import make_policy

    max_batch = 48
    space = Space(batch_bands(sorted(e for e in edges if e <= max_batch) or [max_batch], max_batch), None,
                  tuple(range(0, 6)))
    schedule = tuple(data.draw(st.lists(st.integers(0, 5), min_size=space.size, max_size=space.size)))
    formats = ["lut", "vllm", "trtllm"] + (["sglang"] if min(schedule) >= 1 else [])
    policies = {}
    for fmt in formats:
        spec = engine_policy(space, schedule, fmt)
        policies[fmt] = make_policy(spec.pop("name"), spec)
    view = BatchView(k_max=5)
    for b in range(1, max_batch + 1):
        band = next(i for i, (lo, hi) in enumerate(space.bands) if lo <= b <= hi)
        view.batch_size = view.running = b
        assert {fmt: int(p.choose_k(view)) for fmt, p in policies.items()} == {fmt: schedule[band] for fmt in formats}


# ------------------------------------------------------------------ the objective

def test_objective_names_are_summary_names():
    assert parse_objective("p99_tpot_ms", None) == Objective("p99_tpot_ms", False)
    assert parse_objective("p50_ttft_ms", None).metric == "median_ttft_ms"
    assert parse_objective("goodput", {"ttft": 500.0}) == Objective(GOODPUT, True)
    with pytest.raises(InputError, match="--objective: request goodput needs SLOs"):
        parse_objective("request_goodput", None)
    with pytest.raises(InputError, match="unknown objective 'p95_e2el'"):
        parse_objective("p95_e2el", None)
    goal = Objective(GOODPUT, True)
    assert goal.loss({GOODPUT: 3.0}) == -3.0 and goal.value(-3.0) == 3.0
    assert Objective("mean_e2el_ms", False).loss({"mean_e2el_ms": float("nan")}) == math.inf


def test_paired_difference_and_its_standard_error():
    d = paired([10.0, 12.0, 14.0], [9.0, 10.0, 11.0])  # differences 1, 2, 3
    assert d.mean == pytest.approx(2.0) and d.se == pytest.approx(1.0 / math.sqrt(3))
    assert d.noise == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)  # Student's t(0.975, 2 dof)
    assert d.within_noise  # 2 < 2.48: three seeds cannot tell
    assert not paired([10.0, 12.0, 14.0, 16.0, 18.0], [9.0, 10.0, 11.0, 12.0, 13.0]).within_noise
    assert d.below(0.05) is False and paired([1.0, 2.0, 3.0], [2.0, 3.1, 4.0]).below(0.05)
    assert paired([1.0], [2.0]).se == 0.0 and paired([1.0], [2.0]).within_noise


# ------------------------------------------------------------------ the search on a known objective

def fake_runs(optimum: tuple[int, ...], inert: set[int], noise: float = 0.0):
    """Runs whose mean E2EL is a separable bowl around ``optimum`` plus a per-seed offset shared by every
    schedule (common random numbers); cells in ``inert`` never act, as a band the batch never reaches."""
    counted = []

    def run(pairs, phase):
        counted.extend(pairs)
        out = []
        for schedule, seed in pairs:
            loss = 1000.0 + 50.0 * seed + sum((k - o) ** 2 * (i + 1) for i, (k, o) in enumerate(zip(schedule, optimum))
                                            if i not in inert)
            loss += noise * ((hash((schedule, seed)) % 7) - 3)
            out.append({"mean_e2el_ms": loss, "acting": [k for i, k in enumerate(schedule) if i not in inert]})
        return out
    return run, counted


def test_search_finds_a_separable_optimum_with_far_fewer_runs_than_the_grid():
    space = Space(tuple((b, b) for b in range(1, 7)), None, tuple(range(8)))
    optimum = (5, 4, 4, 3, 1, 0)
    run, counted = fake_runs(optimum, inert=set())
    found = CoordinateSearch(space, Objective("mean_e2el_ms", False), run, seeds=(0, 1, 2)).search(
        [space.uniform(k) for k in space.k_values])
    assert found.best == optimum
    assert found.runs == len(set(counted)) < 8 ** 6 / 100  # a few hundred runs, not 262,144 x 3


def test_search_skips_cells_that_never_act_without_running_them():
    space = Space(tuple((b, b) for b in range(1, 5)), None, tuple(range(6)))
    run, counted = fake_runs((3, 2, 0, 0), inert={2, 3})
    found = CoordinateSearch(space, Objective("mean_e2el_ms", False), run, seeds=(0, 1)).search(
        [space.uniform(k) for k in space.k_values])
    assert found.best[:2] == (3, 2)
    assert found.best[2:] == (found.start[2], found.start[3])  # never moved: nothing to gain there
    inert_cell_runs = [s for s, _ in counted if s[:2] == found.best[:2] and s[2:] != found.best[2:]]
    # One probe per inert cell and seed (2 cells x 2 seeds), none of the other five values of k.
    assert len({(s, seed) for s, seed in counted if s in inert_cell_runs}) <= 4


def test_a_move_must_beat_the_noise():
    """A candidate better on average but within two standard errors of the paired difference is refused."""
    space = Space(((1, 1),), None, (0, 1, 2))
    losses = {((0,), 0): 100.0, ((0,), 1): 110.0, ((0,), 2): 120.0,
              ((1,), 0): 99.0, ((1,), 1): 111.5, ((1,), 2): 118.0,    # -1, +1.5, -2: mean -0.5, within noise
              ((2,), 0): 98.0, ((2,), 1): 108.5, ((2,), 2): 118.5}    # -2, -1.5, -1.5: clearly better
    search = CoordinateSearch(space, Objective("mean_e2el_ms", False), lambda pairs, phase: [
        {"mean_e2el_ms": losses[pair]} for pair in pairs], seeds=(0, 1, 2))
    search.ensure(list(losses), "test")
    assert not search.improves((1,), (0,))
    assert search.improves((2,), (0,))


def test_same_run_compares_nan_as_equal():
    assert same_run({"a": float("nan"), "b": 1.0}, {"b": 1.0, "a": float("nan")})
    assert not same_run({"a": 1.0}, {"a": 1.0 + 1e-12})


# ------------------------------------------------------------------ on the simulator

def small_tune(profile: Path, out: Path, *extra: str, capsys=None, **overrides) -> int:
    settings = {**SMALL, **overrides}
    argv = ["tune", *flags(profile, rate=settings.pop("rate"), num_requests=settings.pop("num_requests")),
            "--executor", "serial", "--no-progress", "--out", str(out)]
    for key, value in settings.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return main(argv + list(extra))


@pytest.fixture(scope="module")
def tuned(linear_profile, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tune") / "small"
    assert small_tune(linear_profile, out) == 0
    return out


def test_the_folder_has_every_output(tuned):
    names = {p.name for p in tuned.iterdir()}
    assert {"tune.json", "report.md", "report.html", "tune.png", "trials.csv", "tuned.toml", "schedule.toml",
            "vllm.json", "trtllm.txt", "cells"} <= names
    doc = json.loads((tuned / "tune.json").read_text())
    html_text = (tuned / "report.html").read_text()
    assert 'src="data:image/png;base64,' in html_text and "tune.png" in (tuned / "report.md").read_text()
    assert doc["seeds"] == {"search": [0, 1], "holdout": [2, 3]}
    labels = [row["label"] for row in doc["holdout"]]
    assert labels[0] == "tuned" and {"none", "fixed k=1", "fixed k=3", "lut alpha=0.7", "goodput k_max=3"} <= set(labels)
    assert any(label.startswith("sglang-adaptive") for label in labels)
    trials = (tuned / "trials.csv").read_text().splitlines()
    cells = list((tuned / "cells").glob("*.json"))
    assert len(trials) - 1 == len(cells)  # every run the tune used is one row and one stored cell


def test_every_format_fed_back_to_its_policy_reproduces_the_tuned_runs(tuned, tmp_path):
    """schedule.toml (lut), vllm.json (vllm-dynamic), trtllm.txt (trtllm-schedule): the tuned runs' bytes."""
    doc = json.loads((tuned / "tune.json").read_text())
    expected = {}
    for cell in (tuned / "cells").glob("*.json"):
        record = json.loads(cell.read_text())
        if record["config"]["policy"] == {"name": "lut", "table": doc["schedule"]["table"]}:
            expected[record["config"]["seed"]] = record["metrics"]
    assert set(expected) >= set(doc["seeds"]["holdout"])
    seed = doc["seeds"]["holdout"][0]
    runs = {"lut": ["--config", str(tuned / "schedule.toml")],
            "vllm": ["--policy", "vllm-dynamic", "--speculative-config", str(tuned / "vllm.json")],
            "trtllm": ["--policy", "trtllm-schedule", "--draft-len-schedule", (tuned / "trtllm.txt").read_text().strip()]}
    if (tuned / "sglang.json").is_file():
        runs["sglang"] = ["--policy", "sglang-adaptive", "--speculative-adaptive-config", str(tuned / "sglang.json")]
    scenario = flags(Path(doc["profile"]), rate=SMALL["rate"], num_requests=SMALL["num_requests"])
    for fmt, policy in runs.items():
        out = tmp_path / fmt
        assert main(["run", *scenario, "--seed", str(seed), *policy, "--records", "none", "--out", str(out),
                     "--quiet"]) == 0
        metrics = json.loads((out / "summary.json").read_text())["metrics"]
        assert {k: v for k, v in metrics.items() if k in expected[seed]} == pytest.approx(expected[seed], nan_ok=True), fmt
    # tuned.toml is the whole scenario at the first held-out seed.
    out = tmp_path / "scenario"
    assert main(["run", "--config", str(tuned / "tuned.toml"), "--records", "none", "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "summary.json").read_text())["metrics"]
    assert metrics["mean_e2el_ms"] == expected[seed]["mean_e2el_ms"]


def test_sglang_format_searches_k_from_one_and_reproduces(linear_profile, tmp_path):
    out = tmp_path / "sglang"
    assert small_tune(linear_profile, out, "--format", "sglang", rate=3.4) == 0
    doc = json.loads((out / "tune.json").read_text())
    assert doc["space"]["k_values"][0] == 1 and min(doc["schedule"]["cells"]) >= 1
    seed = doc["seeds"]["holdout"][0]
    expected = next(r["per_seed_objective"][0] for r in doc["holdout"] if r["label"] == "tuned")
    run = tmp_path / "run"
    assert main(["run", *flags(linear_profile, rate=3.4, num_requests=SMALL["num_requests"]), "--seed", str(seed),
                 "--policy", "sglang-adaptive", "--speculative-adaptive-config", str(out / "sglang.json"),
                 "--records", "none", "--out", str(run), "--quiet"]) == 0
    assert json.loads((run / "summary.json").read_text())["metrics"]["mean_e2el_ms"] == expected


def test_a_cell_never_consulted_is_known_exactly_without_running_it(linear_profile):
    """A band the batch never reaches: any k there that keeps the schedule's largest k gives the same bytes,
    so the search skips it (and every pair it fills in without running equals the real run)."""
    from specbatch.commands.tune.objective import Objective
    from specbatch.commands.tune.trials import Candidate, run_config
    from sim.config import load_config
    from sim.simulate import simulate

    base = load_config(None, {"profile": str(linear_profile), "engine.max_batch_size": 64,
                              "workload.prompt_tokens": SCENARIO["prompt_tokens"],
                              "workload.output_tokens": SCENARIO["output_tokens"], "workload.rate": 1.0,
                              "workload.num_requests": 60})
    space = Space(((1, 2), (3, 8), (9, 16), (17, 64)), None, (0, 1, 2, 3))

    def real(pairs, phase):
        return [simulate(run_config(base, Candidate("x", space.policy(s), s), seed)).summary for s, seed in pairs]
    ran = []

    def counted(pairs, phase):
        ran.extend(pairs)
        return real(pairs, phase)
    search = CoordinateSearch(space, Objective("mean_e2el_ms", False), counted, seeds=(0, 1, 2))
    found = search.search([space.uniform(2)])
    assert found.skipped > 0  # the largest band is never reached at this load
    for schedule, seed in [(found.best[:3] + (k,), s) for k in (0, 1) for s in (0, 1, 2)]:
        assert same_run(real([(schedule, seed)], "check")[0], real([(found.best, seed)], "check")[0])
    inferred = [pair for pair in search.summaries if pair not in set(ran)]
    assert len(inferred) == found.inferred
    for pair in inferred[:6]:
        assert same_run(real([pair], "check")[0], search.summaries[pair])


def test_an_interrupted_tune_resumes_to_the_same_result(linear_profile, tuned, tmp_path, monkeypatch, capsys):
    from specbatch.commands.sweep import executors

    real = executors.run_serial
    calls = {"n": 0}

    def interrupted(tasks):
        for item in real(tasks):
            calls["n"] += 1
            if calls["n"] > 25:
                raise KeyboardInterrupt
            yield item

    out = tmp_path / "resumed"
    monkeypatch.setattr(executors, "run_serial", interrupted)
    assert small_tune(linear_profile, out) == 130
    assert "the same command resumes" in capsys.readouterr().err
    assert len(list((out / "cells").glob("*.json"))) == 25 and not (out / "tune.json").exists()
    monkeypatch.setattr(executors, "run_serial", real)
    assert small_tune(linear_profile, out) == 0
    printed = capsys.readouterr().out
    assert "25 from the store;" in printed
    assert (out / "tune.json").read_bytes() == (tuned / "tune.json").read_bytes()
    assert (out / "report.md").read_bytes() == (tuned / "report.md").read_bytes()


def test_the_pool_gives_the_bytes_of_the_serial_run(linear_profile, tuned, tmp_path, monkeypatch):
    """... and one pool serves every batch of the tune (each new pool's workers would load the engine again)."""
    from specbatch.commands import workers

    started = []
    real = workers.worker_pool
    monkeypatch.setattr(workers, "worker_pool", lambda n: started.append(n) or real(n))
    out = tmp_path / "pool"
    argv = ["tune", *flags(linear_profile, rate=SMALL["rate"], num_requests=SMALL["num_requests"]), "--no-progress",
            "--workers", "2", "--out", str(out)]
    for key in ("k_max", "bands", "seeds", "holdout_seeds"):
        argv += [f"--{key.replace('_', '-')}", str(SMALL[key])]
    assert main(argv) == 0
    assert (out / "tune.json").read_bytes() == (tuned / "tune.json").read_bytes()
    batches = {row["phase"] for row in csv.DictReader((out / "trials.csv").open())}
    assert len(batches) > 2 and started == [2]


def test_a_pooled_tune_leaves_the_engine_and_pandas_to_its_workers(linear_profile, tmp_path, monkeypatch):
    """Every run of a tune on a pool, the band placement's and the cell shares' too, runs on the pool: the tune's
    own process imports neither numba nor pandas (each half a second or more on a small machine), and its
    workers are forked with the engine's modules imported already (by the fork server, once for all)."""
    import subprocess
    import sys

    from tests.conftest import cache_with_compiled_engine

    argv = ["tune", *flags(linear_profile, rate=SMALL["rate"], num_requests=60), "--no-progress", "--workers", "2",
            "--jit", "off", "--k-max", "2", "--bands", "2", "--seeds", "1", "--holdout-seeds", "1",
            "--out", str(tmp_path / "tune")]
    check = "sorted(m for m in ('numba', 'sim.simulate') if m in __import__('sys').modules)"
    script = ("import sys\n"
              "import sim.simulate\n"
              "ran, run = [], sim.simulate.execute\n"
              "sim.simulate.execute = lambda *a, **k: ran.append(1) or run(*a, **k)\n"
              "from specbatch.commands.cli import main\n"
              f"assert main({argv!r}) == 0\n"
              "print(len(ran), [m for m in ('numba', 'pandas') if type(sys.modules.get(m)).__name__ not in ('NoneType', "
              "'_LazyModule')])\n"  # a lazy module is not imported until used (sim.lazy)
              "from specbatch.commands.workers import worker_pool\n"
              f"print(worker_pool(1).submit(eval, {check!r}).result())\n")
    from sim.costmodel import cache
    from sim.simulate import _fitted, checked_profile

    env = {"SPECBATCH_CACHE_DIR": str(cache_with_compiled_engine(tmp_path / "cache")), "PATH": "/usr/bin:/bin",
           "SPECBATCH_BACKGROUND_COMPILE": "0"}
    monkeypatch.setenv(cache.ENV, env["SPECBATCH_CACHE_DIR"])
    _fitted.cache_clear()
    checked_profile(str(linear_profile))  # fitted once on this machine, as any profile after its first run
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    main_modules, worker_modules = done.stdout.strip().splitlines()[-2:]
    from specbatch.commands.workers import METHOD

    preloaded = "['numba', 'sim.simulate']" if METHOD == "forkserver" else worker_modules  # spawn: no fork server
    assert main_modules == "0 []" and worker_modules == preloaded  # no run here, nor their imports
    assert (tmp_path / "tune" / "tune.json").is_file()


@pytest.mark.parametrize("extra, message", [
    (["--objective", "p95_e2el_ms"], "--objective: unknown objective 'p95_e2el_ms'"),
    (["--objective", "goodput"], "--objective: request goodput needs SLOs"),
    (["--k-max", "9"], "--k-max: must be in 1..7 (the profile's measured k_max), got 9"),
    (["--bands", "0"], "--bands: must be at least 1 band"),
    (["--bands", "8,4"], "--bands: edges must increase"),
    (["--context-bands", "1024", "--format", "vllm"], "--format: vllm takes one k per batch size"),
    (["--seeds", "0"], "--seeds: must be a whole number >= 1"),
    (["--rate", "-1"], "workload.rate: must be greater than 0"),
])
def test_bad_input_is_one_line_before_any_run(linear_profile, tmp_path, capsys, extra, message):
    out = tmp_path / "bad"
    code = main(["tune", *flags(linear_profile, num_requests=50), "--executor", "serial", "--no-progress",
                 "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_a_folder_that_is_not_a_tune_is_refused(linear_profile, tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["tune", *flags(linear_profile, num_requests=50), "--out", str(tmp_path)]) == 2
    assert "is not a specbatch tune folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_context_bands_tune_a_context_table(linear_profile, tmp_path):
    out = tmp_path / "context"
    assert small_tune(linear_profile, out, "--context-bands", "400", bands=2, k_max=2) == 0
    doc = json.loads((out / "tune.json").read_text())
    assert doc["space"]["context_bands"][0] == [0, 400] and len(doc["schedule"]["cells"]) == 4
    assert "name = \"context\"" in (out / "schedule.toml").read_text()
    assert not (out / "vllm.json").exists()


def test_the_python_api(linear_profile):
    import specbatch

    result = specbatch.tune(profile=str(linear_profile), **{k: v for k, v in SCENARIO.items()},
                            executor="serial", **SMALL)
    assert list(result.table.policy)[:2] == ["tuned", "none"]
    assert json.loads(result.formats()["vllm"])["num_speculative_tokens_per_batch_size"][0][0] == 1
    assert "held-out" in str(result)
    with pytest.raises(InputError, match="policy: unknown keyword"):
        specbatch.tune(profile=str(linear_profile), policy="goodput", num_requests=50, executor="serial")


@pytest.mark.parametrize("traffic", [["--rate-profile", "phases:1,3:20,20"],
                                     ["--trace", str(Path(__file__).resolve().parents[1] / "docs" / "examples"
                                                     / "traces" / "trace.csv")]])
def test_a_rate_profile_or_a_trace_is_traffic_too(linear_profile, tmp_path, traffic):
    out = tmp_path / "traffic"
    argv = ["tune", *flags(linear_profile), *traffic, "--executor", "serial", "--no-progress", "--out", str(out),
            "--k-max", "2", "--bands", "2", "--seeds", "2", "--holdout-seeds", "2"]
    assert main(argv) == 0
    scenario = json.loads((out / "tune.json").read_text())["scenario"]["workload"]
    assert ("rate_profile" in scenario) == (traffic[0] == "--rate-profile")
    assert ("trace" in scenario) == (traffic[0] == "--trace")


def test_request_goodput_is_maximised(linear_profile, tmp_path):
    out = tmp_path / "goodput"
    assert small_tune(linear_profile, out, "--objective", "request_goodput", "--goodput", "e2el:4000", rate=3.4) == 0
    doc = json.loads((out / "tune.json").read_text())
    assert doc["objective"] == {"metric": "request_goodput", "maximize": True}
    assert doc["goodput_slos_ms"] == {"e2el": 4000.0}
    rows = {row["label"]: row for row in doc["holdout"]}
    tuned = rows["tuned"]["objective"]
    # The tuned schedule keeps at least the goodput of every start it was chosen from on its own seeds,
    # and here on the held-out seeds it is far above plain decoding's.
    assert tuned > rows["none"]["objective"]
    assert all(row["objective"] == pytest.approx(sum(row["per_seed_objective"]) / 2) for row in doc["holdout"])
