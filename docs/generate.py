"""Regenerate, or check, the numbers that README.md and docs/ show.

Numbers in the docs are produced by running commands, never typed by hand. A block the
tool owns is fenced by two HTML comments that markdown does not render:

    <!-- generated: console -->
    ```console
    $ specbatch lut --profile cpu-tinyllama-1.1b-llama-68m --alpha 0.7
    ...what the command printed...
    ```
    <!-- end generated -->

    <!-- generated: policy-table -->
    | policy | mean TPOT (ms) | ... |
    <!-- end generated -->

``console`` blocks rerun each ``$`` line (in a scratch folder) and keep its output; any
other name is a generator function registered below, which returns the block's text. A
``$`` line is ``specbatch ...`` (run in-process), ``echo``, ``python SCRIPT`` (a script the
marker's ``files=`` copies in, see below) or one of a few plain file tools (``SHELL_TOOLS``),
run with no shell; it may start with ``PYTHONPATH=folder``, chain commands with ``|`` and
``&&``, end a command with ``2>/dev/null`` to drop its stderr, and continue on the next line
after a trailing backslash. Paths under the checkout are shown relative to it.

A page that shows a file and runs it names the file in the marker, and the block copies
it (repo-relative paths, files or folders, comma-separated) into the scratch folder at
the same relative path before running, so the page, the run and a reader at the repo
root all use the one file:

    <!-- generated: console files=docs/examples/scenario.toml -->
    ```console
    $ cat docs/examples/scenario.toml
    $ specbatch run --config docs/examples/scenario.toml --quiet
    ```
    <!-- end generated --> Simulation is deterministic, so a fresh block must match what
is in the file byte for byte, apart from wall-clock figures (``VOLATILE``), which are
masked when comparing and rewritten when regenerating, and the last digits of numbers:
across CPUs the cost model's curve fit (OpenBLAS picks its kernels per CPU) moves results
by about 1e-10 relative, so numbers compare equal within ``NUMBER_DRIFT`` (1e-6, one unit
in the 7th significant digit) and all text around them must match exactly.

    python docs/generate.py                 # rewrite every stale block in README.md and docs/
    python docs/generate.py --check         # exit 1 and name the stale blocks; writes nothing
    python docs/generate.py --only README.md

``tests/test_docs_generated.py`` runs ``--check`` on every block, so a change that
moves a documented number fails CI until the docs are regenerated.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?P<open><!-- generated: (?P<name>[\w-]+)(?P<options>(?: [\w-]+=[^\s>]+)*) -->\n)"
                   r"(?P<body>.*?)(?P<close><!-- end generated -->)", re.S)
# Figures that depend on the machine's speed, not on the simulation: masked when comparing.
VOLATILE = (
    re.compile(r"in [\d.,]+ s wall \([\d,]+ steps/s, [\d,]+ requests/s\)"),
    re.compile(r"took [\d.,]+ s"),
    re.compile(r"(?m)^\[\d+/\d+\] [\w.-]+: [\d.]+ s$"),  # specbatch regress: one line per scenario
)
# A number as printed (sign, digits, point, exponent): compared by value, within NUMBER_DRIFT relative.
NUMBER = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
NUMBER_DRIFT = 1e-6


@dataclass(frozen=True)
class Block:
    """One generated block: where it is and what it holds now."""

    path: Path
    name: str
    line: int
    start: int  # offsets of the body in the file's text
    end: int
    body: str
    options: dict[str, str] = field(default_factory=dict)  # name=value pairs after the generator's name


def find_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path, m["name"], text.count("\n", 0, m.start()) + 1, m.start("body"), m.end("body"), m["body"],
                  dict(option.split("=", 1) for option in m["options"].split()))
            for m in BLOCK.finditer(text)]


def masked(text: str) -> str:
    for pattern in VOLATILE:
        text = pattern.sub("<wall-clock>", text)
    return text


def same_numbers(a: str, b: str) -> bool:
    """Equal text, but numbers equal within NUMBER_DRIFT relative (cross-CPU floating-point drift).

    Numbers must also be printed alike (as many characters), except full-precision floats
    (12 digits or more), whose repr is shorter or longer by the drift itself.
    """
    if a == b:
        return True
    parts_a, parts_b = NUMBER.split(a), NUMBER.split(b)  # text, number, text, ..., text
    if len(parts_a) != len(parts_b) or parts_a[::2] != parts_b[::2]:
        return False
    for x, y in zip(parts_a[1::2], parts_b[1::2]):
        if x == y:
            continue
        if len(x) != len(y) and min(sum(c.isdigit() for c in n.lower().split("e")[0]) for n in (x, y)) < 12:
            return False
        u, v = float(x), float(y)
        if not abs(u - v) <= NUMBER_DRIFT * max(abs(u), abs(v)):
            return False
    return True


# --- generators -----------------------------------------------------------------------------


def run_cli(argv: list[str], check: bool = True) -> str:
    """What ``specbatch ARGV`` prints (stdout then stderr), run in-process.

    With ``check=False`` a failing command is fine: the docs show error messages too.
    """
    from specbatch.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if check and code not in (0, None):
        raise RuntimeError(f"specbatch {shlex.join(argv)} exited {code}: {err.getvalue().strip()}")
    return as_on_a_warm_machine(out.getvalue() + err.getvalue())


def as_on_a_warm_machine(text: str) -> str:
    """What a command printed, without the one-off notes of a machine that has not compiled this code
    version's engine yet (sim/jit.py): the docs show what every later run prints."""
    from sim.jit import FIRST_RUN_NOTES

    return "".join(line for line in text.splitlines(keepends=True) if line.rstrip("\n") not in FIRST_RUN_NOTES)


# Plain tools a console block may use to show (or prepare) the files a run wrote. They run as
# processes with no shell, in the scratch folder; ``echo`` and ``specbatch`` run in-process.
SHELL_TOOLS = ("head", "tail", "cut", "cmp", "cat", "wc", "ls", "sed", "grep", "mkdir", "touch", "sort", "cp")
# What a ``$`` line may chain: ``a | b`` feeds a's output to b, ``a && b`` runs b if a exited 0.
OPERATORS = ("|", "&&")
# ``NAME=value`` prefixes a line may set (paths are relative to the scratch folder).
ENVIRONMENT = ("PYTHONPATH",)


@contextlib.contextmanager
def on_sys_path(folders: list[str]):
    """Import from FOLDERS for a moment, as ``PYTHONPATH=...`` would; forget what was imported from them."""
    before = set(sys.modules)
    saved = list(sys.path)
    sys.path[:0] = [os.path.abspath(f) for f in folders]
    try:
        yield
    finally:
        sys.path[:] = saved
        roots = tuple(os.path.abspath(f) + os.sep for f in folders)
        for name in set(sys.modules) - before:
            where = getattr(sys.modules[name], "__file__", None) or ""
            if where.startswith(roots):
                del sys.modules[name]


def run_command(argv: list[str], env: dict[str, str], where: str, stdin: str | None,
                status: int = 0, piped: bool = False) -> tuple[int, str, str]:
    """One simple command (no operators): its exit code, what it printed, and its stderr apart.

    Unless PIPED, stderr is part of what it printed (interleaved with stdout for specbatch,
    as a terminal shows it) and the third item is empty; when the command's stdout feeds a
    pipe, its stderr is returned apart, since a shell shows it rather than piping it. A
    command ending in ``2>/dev/null`` drops its stderr.
    """
    import subprocess

    quiet = argv[-3:] == ["2", ">", "/dev/null"]
    if quiet:
        argv = argv[:-3]
    if argv[0] == "specbatch":
        from specbatch.commands.cli import main

        out = io.StringIO()  # stdout and stderr interleaved, as a terminal shows them
        err = io.StringIO() if quiet or piped else out
        paths = [os.path.join(where, p) for p in env["PYTHONPATH"].split(os.pathsep)] if env.get("PYTHONPATH") else []
        with on_sys_path(paths), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv[1:])
            except SystemExit as exc:  # argparse
                code = exc.code
        apart = as_on_a_warm_machine(err.getvalue()) if piped and not quiet else ""
        return (0 if code is None else int(code)), as_on_a_warm_machine(out.getvalue()), apart
    if argv[0] == "echo":  # $? is the exit code of the command before
        return 0, " ".join(str(status) if a == "$?" else a for a in argv[1:]) + "\n", ""
    if argv[0] == "python":
        script = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
        if script is not None and not os.path.isfile(os.path.join(where, script)):
            raise ValueError(f"python {script}: no such file in the block's scratch folder "
                             f"(name it in the marker: files={script})")
        argv = [sys.executable, *argv[1:]]
    elif argv[0] not in SHELL_TOOLS:
        raise ValueError(f"only specbatch, echo, python and {', '.join(SHELL_TOOLS)} run here: {argv[0]!r}")
    full_env = dict(os.environ)
    if "PYTHONPATH" in env:
        full_env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(os.path.join(where, p))
                                                 for p in env["PYTHONPATH"].split(os.pathsep))
    done = subprocess.run(argv, capture_output=True, text=True, cwd=where, input=stdin, env=full_env)
    stdout, stderr = as_on_a_warm_machine(done.stdout), as_on_a_warm_machine(done.stderr)
    if quiet:
        return done.returncode, stdout, ""
    return (done.returncode, stdout, stderr) if piped else (done.returncode, stdout + stderr, "")


def run_line(command: str, where: str, status: int = 0) -> str:
    """What one ``$`` line prints (see ``run_status``)."""
    return run_status(command, where, status)[1]


def run_status(command: str, where: str, status: int = 0) -> tuple[int, str]:
    """One ``$`` line of a console block: ``[NAME=value ...] tool args [| tool args] [&& ...]``.

    specbatch runs in-process; the plain tools in ``SHELL_TOOLS`` as processes with no shell.
    ``|`` feeds one command's output to the next, ``&&`` stops the line at the first failure.
    Returns the line's exit code and what it printed (a failing specbatch is fine: the docs
    show errors too); STATUS is the previous line's code, which ``echo $?`` prints.
    """
    lexer = shlex.shlex(command.split(" #")[0], posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split, lexer.commenters = True, ""
    tokens = list(lexer)  # an unquoted ; & | < > is a token of its own, as a shell would read it
    env: dict[str, str] = {}
    while tokens and re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[0]):
        name, value = tokens.pop(0).split("=", 1)
        if name not in ENVIRONMENT:
            raise ValueError(f"only {', '.join(ENVIRONMENT)} may be set on a line: {command!r}")
        env[name] = value
    for i, token in enumerate(tokens):
        if token == ">" and tokens[i - 1:i + 2] == ["2", ">", "/dev/null"] and (
                i + 2 == len(tokens) or tokens[i + 2] in OPERATORS):
            continue  # 2>/dev/null, the one redirection allowed: drop that command's stderr
        if token not in OPERATORS and (set(token) <= set(";&|<>") or token.startswith(("$(", "`"))):
            raise ValueError(f"only '|' and '&&' join commands here: {command!r}")
    # Split into (operator, argv) pairs; the first operator is None.
    pieces: list[tuple[str | None, list[str]]] = [(None, [])]
    for token in tokens:
        if token in OPERATORS:
            pieces.append((token, []))
        else:
            pieces[-1][1].append(token)
    if any(not argv for _, argv in pieces):
        raise ValueError(f"an empty command: {command!r}")
    printed, pending, code = "", None, status
    for n, (op, argv) in enumerate(pieces):
        piped = n + 1 < len(pieces) and pieces[n + 1][0] == "|"
        if op == "|":
            code, pending, apart = run_command(argv, env, where, pending, code, piped)
            printed += apart
            continue
        if op == "&&" and code != 0:
            break
        printed += pending or ""
        code, pending, apart = run_command(argv, env, where, None, code, piped)
        printed += apart
    return code, printed + (pending or "")


def scratch_files(block: Block) -> list[str]:
    """The repo files and folders a block's ``files=a,b`` asks for, checked to be inside the repo."""
    names = [n for n in block.options.get("files", "").split(",") if n]
    for name in names:
        path = (ROOT / name).resolve()
        if Path(name).is_absolute() or not path.is_relative_to(ROOT) or not path.exists():
            raise ValueError(f"{block.path}:{block.line}: files={name}: not a file or folder in the repository")
    return names


def dollar_lines(body: str) -> list[str]:
    """The ``$`` commands of a console block, a line ending in `` \\`` joined to the next."""
    commands, lines = [], body.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            command = lines[i][2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command += "\n" + lines[i]
            commands.append(command)
        i += 1
    return commands


def console(block: Block) -> str:
    """Rerun each ``$`` line of a console block, in order, in one scratch folder.

    ``files=a,b`` (in the marker) copies those repository files or folders into the scratch
    folder first, at the same relative paths, so a page can show a file and run it.
    """
    import shutil

    commands = dollar_lines(block.body)
    if not commands:
        raise ValueError(f"{block.path}:{block.line}: a console block needs at least one '$ specbatch ...' line")
    parts = [block.body.splitlines()[0]]  # the fence
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        for name in scratch_files(block):
            source, target = ROOT / name, Path(scratch, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(source, target)
        os.chdir(scratch)
        try:
            status = 0
            for command in commands:
                try:
                    status, printed = run_status(command.replace("\\\n", " "), scratch, status)
                except ValueError as exc:
                    raise ValueError(f"{block.path}:{block.line}: {exc}") from None
                if "Traceback (most recent call last)" in printed:  # a page never shows a crash as output
                    raise ValueError(f"{block.path}:{block.line}: '{command.splitlines()[0]}' crashed:\n{printed}")
                parts.append(f"$ {command}")
                if printed.strip():
                    shown = printed.rstrip("\n").replace(os.path.realpath(scratch) + os.sep, "")
                    parts.append(shown.replace(scratch + os.sep, "").replace(str(ROOT) + os.sep, ""))
        finally:
            os.chdir(cwd)
    return "\n".join(parts) + "\n```\n"


def summary_of(argv: list[str]) -> dict:
    """Run ``specbatch run ARGV`` into a scratch folder and return its summary metrics."""
    import json

    with tempfile.TemporaryDirectory() as scratch:
        run_cli(["run", *argv, "--records", "none", "--out", os.path.join(scratch, "run")])
        return json.loads(Path(scratch, "run", "summary.json").read_text())["metrics"]


POLICY_ROWS = (  # (label, flags): the README's policy table on the default scenario
    ("`none`", ["--policy", "none"]),
    ("`fixed --k 3` (the default)", []),
    ("`lut` built at α = 0.7", ["--config", "{lut}"]),
    ("`goodput`", ["--policy", "goodput"]),
    ("`context` built at α = 0.7", ["--config", "{context}"]),
    ("`adaptive`", ["--policy", "adaptive"]),
)


def policy_table(block: Block) -> str:
    """Every built-in policy on the shipped default scenario, as the README shows it."""
    with tempfile.TemporaryDirectory() as scratch:
        lut = Path(scratch, "lut.toml")
        run_cli(["lut", "--alpha", "0.7", "--out", str(lut)])
        context = Path(scratch, "context.toml")
        context.write_text('[policy]\nname = "context"\nalpha = 0.7\n')
        rows = ["| policy | mean TTFT (ms) | mean TPOT (ms) | mean E2EL (s) | p99 E2EL (s) | mean k |",
                "|---|---|---|---|---|---|"]
        for label, flags in POLICY_ROWS:
            argv = [f.format(lut=lut, context=context) for f in flags]
            m = summary_of(argv)
            rows.append(f"| {label} | {m['mean_ttft_ms']:,.0f} | {m['mean_tpot_ms']:.1f} | {m['mean_e2el_ms'] / 1e3:.2f} "
                        f"| {m['p99_e2el_ms'] / 1e3:.2f} | {m['mean_k']:.2f} |")
    return "\n".join(rows) + "\n"


def _load_doc_module(relative: str):
    """A helper script under docs/ (not a package), loaded by its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def gpu_figures(block: Block) -> str:
    """The composed profiles' sanity figures (docs/figures/gpu_profile_table.py)."""
    return _load_doc_module("docs/figures/gpu_profile_table.py").figures().rstrip("\n") + "\n"


def capacity_table(block: Block) -> str:
    """A table of a committed capacity report (docs/capacity_examples.py writes them): the one under
    the heading ``section`` (dashes for spaces) of ``report`` (its report.md), with only the
    ``columns`` given (0-based, comma-separated) if any."""
    report, heading = block.options.get("report"), block.options.get("section", "Results").replace("-", " ")
    if report is None:
        raise ValueError(f"{block.path}:{block.line}: capacity-table needs report=FOLDER/report.md")
    lines = (ROOT / report).read_text().splitlines()
    try:
        start = lines.index(f"## {heading}") + 1
    except ValueError:
        raise ValueError(f"{block.path}:{block.line}: {report} has no section '## {heading}'") from None
    while not lines[start].startswith("|"):
        start += 1
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    if "columns" in block.options:
        keep = [int(c) for c in block.options["columns"].split(",")]
        cells = [re.split(r"(?<!\\)\|", line)[1:-1] for line in table]
        table = ["|" + "|".join(row[c] for c in keep) + "|" for row in cells]
    return "\n".join(table) + "\n"


def scale(block: Block) -> str:
    """benchmarks/scale.py's table, from its committed results (benchmarks/results/scale.json)."""
    import json

    doc = json.loads((ROOT / "benchmarks" / "results" / "scale.json").read_text())
    return _load_doc_module("benchmarks/scale.py").table(doc)


def engine_speed(block: Block) -> str:
    """benchmarks/engine_speed.py's table, from its committed results (benchmarks/results/engine_speed.json)."""
    import json

    doc = json.loads((ROOT / "benchmarks" / "results" / "engine_speed.json").read_text())
    return _load_doc_module("benchmarks/engine_speed.py").table(doc)


def regress_baseline(block: Block) -> str:
    """What the project's regression baseline holds (docs/regress.md), counted from the file: its
    scenarios, and per profile how many and their requests (each scenario's expected ``completed``)."""
    from specbatch.commands.regress import load_baseline, scenario_config

    base = load_baseline(ROOT / "tests" / "baselines" / "specbatch.toml")
    requests: dict[str, list[int]] = {}
    for scenario in base.scenarios:
        profile = scenario_config(base, scenario, {}).profile
        requests.setdefault(profile, []).append(int(scenario.expected["completed"]))
    groups = [f"{len(counts)} of {min(counts):,}" + (f"–{max(counts):,}" if max(counts) > min(counts) else "")
              + f" requests on `{profile}`" for profile, counts in requests.items()]
    listed = groups[0] if len(groups) == 1 else f"{', '.join(groups[:-1])} and {groups[-1]}"
    return (f"[`tests/baselines/specbatch.toml`](../tests/baselines/specbatch.toml) holds {len(base.scenarios)} "
            f"scenarios: {listed}.\n")


GENERATORS: dict[str, Callable[[Block], str]] = {
    "console": console,
    "regress-baseline": regress_baseline,
    "scale": scale,
    "engine-speed": engine_speed,
    "policy-table": policy_table,
    "gpu-figures": gpu_figures,
    "capacity-table": capacity_table,
}


# --- driver ---------------------------------------------------------------------------------


def study_generators() -> dict[str, Callable[[Block], str]]:
    """The study pages' tables, read from their committed results (docs/studies/tables.py)."""
    tables = _load_doc_module("docs/studies/tables.py").TABLES
    return {name: (lambda block, table=table: table()) for name, table in tables.items()}


GENERATORS.update(study_generators())


def doc_files(only: list[str] | None = None) -> list[Path]:
    if only:
        return [(ROOT / name).resolve() for name in only]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def regenerate(block: Block) -> str:
    if block.name not in GENERATORS:
        raise ValueError(f"{block.path}:{block.line}: unknown generator {block.name!r} "
                         f"(known: {', '.join(sorted(GENERATORS))})")
    return GENERATORS[block.name](block)


def stale_blocks(paths: list[Path]) -> list[tuple[Block, str]]:
    """Every block whose fresh text differs from the file's (wall-clock figures and last-digit drift aside)."""
    stale = []
    for path in paths:
        for block in find_blocks(path):
            fresh = regenerate(block)
            if not same_numbers(masked(fresh), masked(block.body)):
                stale.append((block, fresh))
    return stale


def rewrite(path: Path, fresh_by_start: dict[int, str]) -> None:
    from sim.atomic_write import write_file

    text = path.read_text()
    for block in sorted(find_blocks(path), key=lambda b: -b.start):
        if block.start in fresh_by_start:
            text = text[:block.start] + fresh_by_start[block.start] + text[block.end:]
    write_file(path, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--check", action="store_true", help="name the stale blocks and exit 1; write nothing")
    parser.add_argument("--only", action="append", help="a markdown file (relative to the repo root)")
    args = parser.parse_args(argv)
    stale = stale_blocks(doc_files(args.only))
    for block, _ in stale:
        shown = block.path.relative_to(ROOT) if block.path.is_relative_to(ROOT) else block.path
        print(f"stale: {shown}:{block.line} ({block.name})")
    if args.check:
        return 1 if stale else 0
    by_path: dict[Path, dict[int, str]] = {}
    for block, fresh in stale:
        by_path.setdefault(block.path, {})[block.start] = fresh
    for path, fresh in by_path.items():
        rewrite(path, fresh)
    print(f"{len(stale)} block(s) regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
