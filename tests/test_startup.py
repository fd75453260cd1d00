"""A run's fixed cost (issue 36): what `specbatch run` leaves out of its start and its exit.

Each behaviour here was measured to cost a short run a share of its whole process; these
tests hold the behaviour (what is imported, how the process ends, the collector's state),
not a time, so they do not depend on the machine's load.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import specbatch.commands.cli as cli

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["run", "--num-requests", "40", "--jit", "off", "--quiet"]


def _python(code: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, check=True)


def test_run_parses_without_importing_the_other_commands_modules():
    """`run`, `--help` and bad input build the other commands' parsers from their names alone."""
    code = ("import sys; from specbatch.commands.cli import COMMANDS, build_parser; "
            "build_parser('run', every=False).parse_args(['run', '--rate', '2']); "
            "print(sorted(m for m, _ in COMMANDS.values() if m in sys.modules))")
    assert _python(code).stdout.strip() == "[]"
    code = ("import sys; from specbatch.commands.cli import COMMANDS, build_parser; "
            "build_parser('sweep', every=False); print(sorted(m for m, _ in COMMANDS.values() if m in sys.modules))")
    assert _python(code).stdout.strip() == "['specbatch.commands.sweep.cli']"


def test_the_top_levels_help_imports_none_of_the_simulator():
    """`specbatch --help`, `--version` and a bare `specbatch` name the commands without their flags, which
    import the simulator's settings and numpy with them (0.2 s of a 0.1 s answer on a slow machine)."""
    heavy = ("numpy", "sim.config", "specbatch.commands.flags", "specbatch.commands.vllm_bench", "workloads.arrivals")
    for argv in (["--help"], ["--version"], []):
        code = ("import sys; from specbatch.commands.cli import main\n"
                "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
                f"print(sorted(m for m in sys.modules if m.startswith({heavy!r})), file=sys.stderr)")
        assert _python(code, *argv).stderr.strip().splitlines()[-1] == "[]", argv
    code = ("import sys; from specbatch.commands.cli import main\n"
            "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('sim.config' in sys.modules, file=sys.stderr)")
    assert _python(code).stderr.strip().splitlines()[-1] == "True"  # (the test sees what a command's help loads)


def test_a_bad_run_setting_is_refused_before_the_simulator_is_imported():
    """`run` checks its config (load_config) before it imports the simulator and the writers (sim.simulate,
    the cluster, pyarrow): a bad value was answered in 0.36 s instead of 0.46 s (paired runs)."""
    heavy = ("sim.simulate", "sim.cluster", "specbatch.commands.outputs", "pyarrow", "numba")
    for argv in (["--num-requests", "-3"], ["--rate", "-1"], ["--max-batch-size", "0"]):
        code = ("import sys; from specbatch.commands.cli import main\n"
                "code = main(['run', *sys.argv[1:]])\n"
                f"print(code, sorted(m for m in sys.modules if m.startswith({heavy!r})), file=sys.stderr)")
        assert _python(code, *argv).stderr.strip().splitlines()[-1] == "2 []", argv


REFUSED_NAMES = {  # a command and its mistyped name -> the one line it answers with
    ("run", "--profile", "nosuch"): "error: --profile: profile: no profile directory 'nosuch' and no shipped profile",
    ("run", "--policy", "nosuch"): "error: --policy: policy.name: unknown policy 'nosuch' (built in: ",
    ("run", "--policy", "no_such_module:Policy"): "error: --policy: policy.name: cannot import module 'no_such_module'",
    ("capacity", "--slo", "p99_ttft_ms=1000", "--profile", "nosuch"):
        "error: --profile: profile: no profile directory 'nosuch'",
    ("capacity", "--slo", "p99_ttft_ms=1000", "--profiles", "cpu-llama-160m-llama-68m,nosuch"):
        "error: --profiles: no profile directory 'nosuch'",
    ("capacity", "--slo", "p99_ttft_ms=1000", "--policies", "fixed,nosuch"):
        "error: --policies: policy.name: nosuch: unknown policy 'nosuch'",
    ("tune", "--profile", "nosuch"): "error: --profile: profile: no profile directory 'nosuch'",
}


def test_a_mistyped_profile_or_policy_name_is_refused_before_the_simulator_is_loaded():
    """The names are looked up before the simulator is imported (a run's profile: 0.47-0.55 s -> 0.27-0.34 s
    to the error) and before a search's pool server starts, whose imports took the two cores from the check."""
    heavy = ("sim.simulate", "sim.cluster", "numba")
    for argv, says in REFUSED_NAMES.items():
        code = ("import sys; from multiprocessing import forkserver; from specbatch.commands.cli import main\n"
                "code = main(sys.argv[1:])\n"
                "print(code, forkserver._forkserver._forkserver_pid is not None, "
                f"sorted(m for m in sys.modules if m.startswith({heavy!r})), file=sys.stderr)")
        *said, verdict = _python(code, *argv).stderr.strip().splitlines()
        assert verdict == "2 False []" and len(said) == 1 and said[0].startswith(says), (argv, said, verdict)


def test_specbatch_profiles_lists_from_the_sidecars_alone():
    """The listing reads each profile.json, not its points (pandas and every profile.csv: 2 s)."""
    code = ("import sys, io, contextlib\nfrom specbatch.commands.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(['profiles'])\n"
            "print('pandas.core.frame' in sys.modules, 'scipy.interpolate' in sys.modules)")  # (pandas: lazy until used)
    assert _python(code).stdout.split() == ["False", "False"]


def test_every_commands_help_is_the_same_built_lazily_or_in_full():
    full = cli.build_parser()
    lazy = cli.build_parser(None, every=False)
    assert lazy.format_help() == full.format_help()
    for name in [*cli.COMMANDS, "run", "lut", "profiles"]:
        subparsers = [a for a in cli.build_parser(name, every=False)._actions if a.dest == "command"][0]
        everything = [a for a in full._actions if a.dest == "command"][0]
        assert subparsers.choices[name].format_help() == everything.choices[name].format_help()


def test_a_run_collects_no_garbage_while_it_works_and_restores_the_collector(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(cli, "_simulate", lambda args: seen.append(gc.isenabled()) or 0)
    assert gc.isenabled()
    assert cli.main([*QUICK, "--out", str(tmp_path / "run")]) == 0
    assert seen == [False] and gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        assert cli.main([*QUICK, "--out", str(tmp_path / "run")]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_console_scripts_run_leaves_the_collector_off_for_the_exit(monkeypatch, tmp_path):
    # Turned back on, the collector went through every object the run had made at the next allocation
    # (0.01 s of a short run), just before the process ended without its teardown anyway.
    monkeypatch.setattr(cli, "_EXITS_AFTER_RUN", True)
    try:
        assert cli.main([*QUICK, "--out", str(tmp_path / "run")]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_finished_run_ends_without_teardown_and_loses_no_output(tmp_path):
    """The process ends by os._exit once every file is written: status 0, stdout flushed whole, and
    the interpreter's exit handlers (here, one that would print) never run."""
    out = tmp_path / "run"
    code = ("import atexit, sys; from specbatch.commands.cli import entry_point; "
            "atexit.register(lambda: print('teardown ran')); sys.argv = ['specbatch', *sys.argv[1:]]; entry_point()")
    done = subprocess.run([sys.executable, "-c", code, *QUICK, "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(out)]
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "requests.csv", "steps.csv", "summary.json"]
    bad = subprocess.run([sys.executable, "-c", code, "run", "--rate", "-1"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "teardown ran\n"  # any other ending exits as Python does


def test_a_trace_without_alpha_or_label_does_not_import_pyarrow_compute(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,7\n")
    code = ("import sys; from workloads.trace import read_trace; r = read_trace(sys.argv[1]); "
            "print(len(r.arrival_s), 'pyarrow.compute' in sys.modules)")
    assert _python(code, str(trace)).stdout.split() == ["2", "False"]
    trace.write_text("arrival_s,prompt_tokens,output_tokens,alpha\n0,10,5,0.5\n0.5,20,7,\n")
    assert _python(code, str(trace)).stdout.split() == ["2", "True"]
