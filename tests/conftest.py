from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.synthetic import make_profile

# The fitted-profile cache (sim/costmodel/cache.py) of this test session: never the user's own, shared by
# the xdist workers and the subprocesses they start (an entry is written whole or not at all).
os.environ.setdefault("SPECBATCH_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"specbatch-test-cache-{os.getuid()}"))

# The compiled rules live in the session's cache too, fixed now for the whole process: a test
# that points SPECBATCH_CACHE_DIR at a folder of its own would otherwise, when it happened to run
# first, send this worker's compilation (tens of seconds) there, to be redone by every worker.
# Compilation stays in the test processes (no background warm-up process left behind by a test).
os.environ.setdefault("SPECBATCH_BACKGROUND_COMPILE", "0")
from sim import jit  # noqa: E402

if jit.numba_available():
    jit.prepare()


_WARMING: subprocess.Popen | None = None  # the xdist controller's compile of the longest share (below)


def pytest_sessionstart(session):
    """On a cold compiled-code cache under xdist, the controller (which runs no tests) compiles the kernels
    few tests need and that take longest (sim.warm.share 1 of 2: the disaggregated and the routed cluster
    kernels) in a process of its own, while the workers compile the rest as their tests reach it. sim.jit
    lets one process at a time compile an entry point and the others load it: without this, both workers
    would reach each kernel in their first tests and compile it side by side, minutes each."""
    global _WARMING
    if not session.config.pluginmanager.hasplugin("dsession") or not jit.numba_available() or jit.is_warm():
        return
    if any(jit.cache_folder().rglob("pd_kernel.run_pd-*.nbi")):  # compiled by an earlier session
        return
    code = "from sim import warm; warm.run_compiled(warm.share(1, 2))"
    _WARMING = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1])


def pytest_sessionfinish(session):
    """The controller's compile leaves no process behind (should the tests end first)."""
    if _WARMING is not None and _WARMING.poll() is None:
        _WARMING.kill()
        _WARMING.wait()


# The shipped defaults as they were before the default moved to the H100 profile (issue 18):
# tests of scheduling logic layer on these, so that what they check keeps its meaning.
CPU_DEFAULTS = Path(__file__).parent / "baselines" / "scenarios" / "cpu.toml"
# The same, as `specbatch run` flags, for CLI tests that also pass a --config of their own.
# The device the real-model tests (tests/test_replay.py, tests/test_calibrate_model.py) run
# on: "cpu" in CI; SPECBATCH_TEST_DEVICE=cuda runs the same checks on a GPU.
TEST_DEVICE = os.environ.get("SPECBATCH_TEST_DEVICE", "cpu")
CPU_DEFAULT_FLAGS = ["--max-batch-size", "32", "--prompt-tokens", "lognormal:128:0.5:512",
                     "--output-tokens", "lognormal:128:0.5:512"]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """systems/-style folder: tiny.yaml + data/tiny/{gemm,attention}/vllm/0.24.0/*.parquet (tests/tiny_kernels.py)."""
    pytest.importorskip("pyarrow", reason="writing Parquet needs pyarrow")
    pytest.importorskip("yaml", reason="the spec sheet is YAML")
    from tests.tiny_kernels import write_tiny_gpu

    root = tmp_path_factory.mktemp("systems")
    write_tiny_gpu(root)
    return root


@pytest.fixture(scope="session")
def synthetic_profile(tmp_path_factory) -> Path:
    """A hand-made profile with costs linear in work (see tests/synthetic.py)."""
    return make_profile(tmp_path_factory.mktemp("profiles") / "synthetic")


@pytest.fixture
def run_config(synthetic_profile):
    """Build a RunConfig from flag-style overrides on top of the pre-issue-18 defaults (CPU_DEFAULTS)."""
    from sim.config import load_config

    def build(**overrides):
        flags = {"profile": (str(synthetic_profile), "--profile")}
        for key, value in overrides.items():
            flags[key.replace("__", ".")] = (value, f"--{key}")
        return load_config(CPU_DEFAULTS, flags)

    return build


def cache_with_compiled_engine(folder: Path) -> Path:
    """An empty cache folder for a fresh process (``SPECBATCH_CACHE_DIR``) that holds this session's
    compiled engine: the process fits its profile afresh but loads the engine instead of compiling it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / jit.cache_folder().name).symlink_to(jit.cache_folder(), target_is_directory=True)
    return folder


def load_script(relative: str, name: str):
    """A script of this repository (``benchmarks/x.py``, ``docs/y.py``) as a module named ``name``: they
    are scripts, not packages. It is in ``sys.modules`` while it runs (dataclasses look it up there);
    pop it when done if the name must not outlive the test."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def validation_bench():
    """benchmarks/validation.py as a module (it is a script, not a package)."""
    import sys

    yield load_script("benchmarks/validation.py", "validation_bench")
    sys.modules.pop("validation_bench", None)



def pytest_collection_modifyitems(config, items):
    """The long tests first (those marked slow and the docs pages' freshness checks), in their order:
    with two test processes stealing work from each other (``--dist worksteal``), a long test that
    starts last leaves the other process idle for its length; started first, it overlaps the short ones."""
    def long(item) -> bool:
        return item.get_closest_marker("slow") is not None or item.nodeid.startswith(
            "tests/test_docs_generated.py::test_every_generated_block_is_fresh")

    def clusters(item) -> bool:  # the long ones that run the cluster kernels, which compile longest (below)
        return "disaggregat" in item.nodeid or "docs/cluster.md" in item.nodeid

    # stable: the rest keep their order. On a cold cache the long ones that need the cluster kernels go last
    # among the long, by when the session's controller has them compiled (pytest_sessionstart).
    items.sort(key=lambda item: (not long(item), long(item) and clusters(item)))
