"""The README's tour runs as written: every file its commands read ships with the repository (or an
earlier command of the tour writes it), every profile it names is shipped (or calibrated earlier),
and its `specbatch run` lines run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specbatch.commands.cli import main
from sim.costmodel.profile import shipped_profiles

ROOT = Path(__file__).resolve().parents[1]
INPUT_FLAGS = ("--config", "--trace", "--trace-vllm", "--acceptance-trace", "--baseline")
OUTPUT_FLAGS = ("--out",)


def tour_commands() -> list[list[str]]:
    """Every command of the README's bash blocks, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line:
                for part in line.split("&&"):
                    commands.append(shlex.split(part))
    return commands


def program(argv: list[str]) -> tuple[str, list[str]]:
    """The command without ``NAME=value`` prefixes: (its program, its arguments)."""
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
        argv = argv[1:]
    return argv[0], argv[1:]


def test_every_file_the_tour_reads_ships_or_is_written_before():
    written: set[str] = set()
    missing = []
    for argv in tour_commands():
        tool, args = program(argv)
        reads = [args[i + 1] for i, a in enumerate(args[:-1]) if a in INPUT_FLAGS]
        if tool == "specbatch" and args[:1] in (["sweep"], ["compare"]):
            reads.append(args[1])
        if tool == "cp":
            reads.append(args[0])
            written.add(args[1])
        profiles = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--profile"]
        profiles += [p for i, a in enumerate(args[:-1]) if a == "--profiles" for p in args[i + 1].split(",")]
        for name in reads:
            if name not in written and not (ROOT / name).exists():
                missing.append(f"{' '.join(argv)}: {name}")
        for name in profiles:
            if name not in written and name not in shipped_profiles():
                missing.append(f"{' '.join(argv)}: profile {name}")
        written.update(args[i + 1] for i, a in enumerate(args[:-1]) if a in OUTPUT_FLAGS)
    assert not missing, "README commands name files that do not ship:\n" + "\n".join(missing)


def run_lines() -> list[list[str]]:
    return [program(argv)[1] for argv in tour_commands()
            if program(argv)[0] == "specbatch" and program(argv)[1][:1] == ["run"]]


@pytest.mark.slow
@pytest.mark.parametrize("args", run_lines(), ids=lambda args: " ".join(args[1:])[:60])
def test_the_tour_s_run_lines_run(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("docs", "tests"):  # the files the tour names, at the paths it names them
        (tmp_path / name).symlink_to(ROOT / name)
    argv = [a for a in args if a != "--quiet"]
    if "--out" not in argv:
        argv += ["--out", "out"]
    assert main([*argv, "--records", "none"]) == 0, capsys.readouterr().err
