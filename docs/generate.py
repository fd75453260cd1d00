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

``console`` blocks rerun each ``$ specbatch ...`` line (in-process, in a scratch folder)
and keep its output; any other name is a generator function registered below, which
returns the block's text. Simulation is deterministic, so a fresh block must match what
is in the file byte for byte, apart from wall-clock figures (``VOLATILE``), which are
masked when comparing and rewritten when regenerating.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?P<open><!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- end generated -->)",
                   re.S)
# Figures that depend on the machine's speed, not on the simulation: masked when comparing.
VOLATILE = (
    re.compile(r"in [\d.,]+ s wall \([\d,]+ steps/s, [\d,]+ requests/s\)"),
    re.compile(r"took [\d.,]+ s"),
)


@dataclass(frozen=True)
class Block:
    """One generated block: where it is and what it holds now."""

    path: Path
    name: str
    line: int
    start: int  # offsets of the body in the file's text
    end: int
    body: str


def find_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path, m["name"], text.count("\n", 0, m.start()) + 1, m.start("body"), m.end("body"), m["body"])
            for m in BLOCK.finditer(text)]


def masked(text: str) -> str:
    for pattern in VOLATILE:
        text = pattern.sub("<wall-clock>", text)
    return text


# --- generators -----------------------------------------------------------------------------


def run_cli(argv: list[str], check: bool = True) -> str:
    """What ``specbatch ARGV`` prints (stdout then stderr), run in-process.

    With ``check=False`` a failing command is fine: the docs show error messages too.
    """
    from sim.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if check and code not in (0, None):
        raise RuntimeError(f"specbatch {shlex.join(argv)} exited {code}: {err.getvalue().strip()}")
    return out.getvalue() + err.getvalue()


# Plain tools a console block may use to show the files a run wrote.
SHELL_TOOLS = ("head", "tail", "cut", "cmp", "cat", "wc", "ls")


def run_line(command: str, where: str) -> str:
    """One ``$`` line of a console block: specbatch in-process, or a plain file tool."""
    import subprocess

    argv = shlex.split(command.split(" #")[0])
    if argv[0] == "specbatch":
        return run_cli(argv[1:], check=False)
    if argv[0] not in SHELL_TOOLS or any(part in ("|", ";", "&&", ">") for part in argv):
        raise ValueError(f"only specbatch and {', '.join(SHELL_TOOLS)} run here: {command!r}")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=where)
    return done.stdout + done.stderr


def console(block: Block) -> str:
    """Rerun each ``$`` line of a console block, in order, in one scratch folder."""
    lines = [line[2:] for line in block.body.splitlines() if line.startswith("$ ")]
    if not lines:
        raise ValueError(f"{block.path}:{block.line}: a console block needs at least one '$ specbatch ...' line")
    parts = [block.body.splitlines()[0]]  # the fence
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)
        try:
            for command in lines:
                try:
                    printed = run_line(command, scratch)
                except ValueError as exc:
                    raise ValueError(f"{block.path}:{block.line}: {exc}") from None
                parts.append(f"$ {command}")
                if printed.strip():
                    parts.append(printed.rstrip("\n").replace(scratch + os.sep, ""))
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


def gpu_figures(block: Block) -> str:
    """The composed profiles' sanity figures (docs/figures/gpu_profile_table.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_profile_table", ROOT / "docs" / "figures" / "gpu_profile_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.figures().rstrip("\n") + "\n"


GENERATORS: dict[str, Callable[[Block], str]] = {
    "console": console,
    "policy-table": policy_table,
    "gpu-figures": gpu_figures,
}


# --- driver ---------------------------------------------------------------------------------


def study_generators() -> dict[str, Callable[[Block], str]]:
    """The study pages' tables, read from their committed results (docs/studies/tables.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_tables", ROOT / "docs" / "studies" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: (lambda block, table=table: table()) for name, table in module.TABLES.items()}


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
    """Every block whose fresh text differs from the file's (wall-clock figures aside)."""
    stale = []
    for path in paths:
        for block in find_blocks(path):
            fresh = regenerate(block)
            if masked(fresh) != masked(block.body):
                stale.append((block, fresh))
    return stale


def rewrite(path: Path, fresh_by_start: dict[int, str]) -> None:
    text = path.read_text()
    for block in sorted(find_blocks(path), key=lambda b: -b.start):
        if block.start in fresh_by_start:
            text = text[:block.start] + fresh_by_start[block.start] + text[block.end:]
    tmp = path.with_name(path.name + ".partial")  # LEAD: switch to the one atomic-write helper after merge
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
