"""benchmarks/gpu_session.sh, the one call a lent GPU gets: its dry run, so that it cannot rot unseen.

A lent GPU comes by chance and for minutes; a script that breaks there (as it would have under
NUMBA_DISABLE_JIT before the fix in sim/jit.py) wastes the loan. Its dry run (DRY_RUN=1: tiny models,
the CPU) runs the same commands; here the quick phases, and the packing of what comes back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="the session script needs bash and coreutils' timeout")
def test_the_dry_run_runs_the_quick_phases_and_packs_what_comes_back(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    # TERMS_SECTIONS: two of the terms' sections (gpu_step_terms.py's own test runs them all)
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(out), "SITE": str(tmp_path / "site"),
           "TERMS_SECTIONS": "floor sustained",
           "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))}
    subprocess.run(["bash", "benchmarks/gpu_session.sh", str(work), "200", "env", "terms", "pack"], cwd=ROOT,
                   env=env, check=True, timeout=600, capture_output=True)
    phases = (out / "phases.txt").read_text()
    for phase in ("env", "attention", "terms"):
        assert f"[{phase}] rc=0" in phases, (phase, phases, (work / "logs" / f"{phase}.log").read_text()[-2000:])
    assert "split kernel is CUDA's" in (work / "logs" / "attention.log").read_text()  # which attention it picks
    terms = json.loads((out / "gpu_step_terms.json").read_text())
    assert terms["dry_run"] is True
    assert list(terms["sections"]) == ["floor", "sustained"]
    with tarfile.open(out / "session.tgz") as tar:
        names = tar.getnames()
    assert "work/terms/gpu_step_terms.json" in names and "work/logs/phases.txt" in names
