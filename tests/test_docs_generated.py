"""Every generated block in README.md and docs/ matches what its command prints today.

A change that moves a documented number fails here until ``python docs/generate.py``
rewrites the block (and the prose around it is re-read).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generate():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_every_generated_block_is_fresh(generate):
    blocks = [b for path in generate.doc_files() for b in generate.find_blocks(path)]
    assert blocks, "README.md and docs/ should hold generated blocks"
    stale = generate.stale_blocks(generate.doc_files())
    assert not stale, "stale docs (run `python docs/generate.py`): " + ", ".join(
        f"{b.path.relative_to(ROOT)}:{b.line} ({b.name})" for b, _ in stale)


def test_a_changed_number_is_caught_and_rewritten(generate, tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("intro\n<!-- generated: console -->\n```console\n"
                   "$ specbatch lut --profile cpu-tinyllama-1.1b-llama-68m --alpha 0.7 --max-batch 4\nold\n```\n"
                   "<!-- end generated -->\noutro\n")
    assert [b.line for b, _ in generate.stale_blocks([doc])] == [2]
    assert generate.main(["--only", str(doc)]) == 0
    assert generate.stale_blocks([doc]) == []
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("<!-- end generated -->\noutro\n")
    assert "alpha 0.7, k in 0..4, context 512 tokens, batch 1..4" in text
    assert generate.main(["--check", "--only", str(doc)]) == 0


def test_wall_clock_figures_are_not_compared(generate):
    a = "Simulated 10 requests, 92 engine steps in 0.06 s wall (14,402 steps/s, 1,615 requests/s)."
    b = "Simulated 10 requests, 92 engine steps in 0.31 s wall (2,970 steps/s, 323 requests/s)."
    assert generate.masked(a) == generate.masked(b)
    assert generate.masked(a) != generate.masked(a.replace("92 engine", "93 engine"))


def test_unknown_generator_names_file_and_line(generate, tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("\n\n<!-- generated: nope -->\nx\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match=r"page.md:3: unknown generator 'nope'"):
        generate.stale_blocks([doc])
