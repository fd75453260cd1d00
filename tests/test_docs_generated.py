"""Every generated block in README.md and docs/ matches what its command prints today.

A change that moves a documented number fails here until ``python docs/generate.py``
rewrites the block (and the prose around it is re-read).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generate():
    yield load_script("docs/generate.py", "docs_generate")
    sys.modules.pop("docs_generate", None)


# One test per page, so that the test processes share the pages' runs (docs/tune.md's alone takes a
# minute). The same list as generate.doc_files(), which test_every_page_is_checked holds it to.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_page_is_checked(generate):
    assert PAGES == generate.doc_files()
    assert sum(len(generate.find_blocks(path)) for path in PAGES) > 50, "README.md and docs/ hold generated blocks"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_generated_block_is_fresh(generate, page):
    stale = generate.stale_blocks([page])
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


def test_last_digit_drift_of_numbers_is_not_compared(generate):
    """Across CPUs (OpenBLAS kernels) the fitted cost curves move results ~1e-10 relative: a block
    printed on another machine is still fresh. A number that really moved, or any other text, is not."""
    same = generate.same_numbers
    a = '  "token_goodput": 196.5857121038937,\n  "duration": 304.76098528417054,\n'
    assert same(a, a.replace("196.5857121038937", "196.58571210389584").replace("054,", "026,"))
    assert same("mean_ttft_ms  3380.920  ok", "mean_ttft_ms  3380.921  ok")  # 7th significant digit
    for stale in ("196.5857", "196.5867121038937", "-196.5857121038937", "196.5857121038937 1", "196e2"):
        assert not same(a, a.replace("196.5857121038937", stale)), stale
    assert not same(a, a.replace("token_goodput", "token_badput"))
    assert not same("p99 3380.92 ms", "p99 3380.95 ms") and not same("92 engine steps", "93 engine steps")
    assert not same("delta +2.9e-11", "delta -2.9e-11") and not same("1.5e-11", "1.5e-12")
    assert not same("14,402 steps", "14,403 steps") and not same("a  1", "a 1")
    assert not same("3380.920", "3380.92") and not same("mean 0.5", "mean 0.50")  # printed otherwise


def test_unknown_generator_names_file_and_line(generate, tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("\n\n<!-- generated: nope -->\nx\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match=r"page.md:3: unknown generator 'nope'"):
        generate.stale_blocks([doc])


def _block(generate, tmp_path, marker: str, body: str):
    doc = tmp_path / "page.md"
    doc.write_text(f"{marker}\n```console\n{body}```\n<!-- end generated -->\n")
    [block] = generate.find_blocks(doc)
    return block


def test_marker_options_are_parsed(generate, tmp_path):
    block = _block(generate, tmp_path, "<!-- generated: console files=docs/examples/my_policy.py,tests/baselines -->",
                   "$ echo hi\n")
    assert block.name == "console"
    assert block.options == {"files": "docs/examples/my_policy.py,tests/baselines"}
    assert generate.find_blocks(tmp_path / "page.md")[0].body.startswith("```console\n")


def test_files_are_copied_at_their_repo_paths(generate, tmp_path):
    block = _block(generate, tmp_path, "<!-- generated: console files=docs/examples/my_policy_baseline.toml -->",
                   "$ head -2 docs/examples/my_policy_baseline.toml\n")
    fresh = generate.console(block)
    expected = "".join((ROOT / "docs/examples/my_policy_baseline.toml").read_text().splitlines(True)[:2])
    assert fresh == "```console\n$ head -2 docs/examples/my_policy_baseline.toml\n" + expected + "```\n"


def test_a_script_not_copied_in_is_refused_not_recorded(generate, tmp_path):
    """`python SCRIPT` runs in the scratch folder: a script the marker does not copy in is an error naming
    the page and the fix, not a recorded "can't open file"."""
    block = _block(generate, tmp_path, "<!-- generated: console -->", "$ python docs/figures/drafter_costs.py\n")
    with pytest.raises(ValueError, match=r"page.md:1: python docs/figures/drafter_costs.py: no such file .*"
                                         r"files=docs/figures/drafter_costs.py"):
        generate.console(block)
    copied = _block(generate, tmp_path, "<!-- generated: console files=docs/figures/drafter_costs.py -->",
                    "$ python docs/figures/drafter_costs.py\n")
    assert "drafting k = 3 tokens per sequence" in generate.console(copied)


def test_a_command_that_crashes_is_refused_not_recorded(generate, tmp_path):
    """A script that dies with a traceback (a data folder the marker forgot to copy in, say) stops the
    generator naming the page and the command: a page never shows a crash as a command's output."""
    block = _block(generate, tmp_path, "<!-- generated: console files=benchmarks/replay_attention_term.py -->",
                   "$ python benchmarks/replay_attention_term.py --from no-such-folder\n")
    with pytest.raises(ValueError, match=r"page.md:1: 'python benchmarks/replay_attention_term.py --from "
                                         r"no-such-folder' crashed:\nTraceback"):
        generate.console(block)


@pytest.mark.parametrize("files", ["../outside.toml", "/etc/passwd", "docs/examples/no-such-file.toml"])
def test_files_outside_the_repo_or_missing_are_refused(generate, tmp_path, files):
    block = _block(generate, tmp_path, f"<!-- generated: console files={files} -->", "$ echo hi\n")
    with pytest.raises(ValueError, match=r"page.md:1: files=.*not a file or folder in the repository"):
        generate.console(block)


def test_and_runs_the_next_command_only_after_success(generate, tmp_path):
    (tmp_path / "a").write_text("x\n")
    (tmp_path / "b").write_text("x\n")
    (tmp_path / "c").write_text("y\n")
    assert generate.run_line("cmp a b && echo same", str(tmp_path)) == "same\n"
    printed = generate.run_line("cmp a c && echo same", str(tmp_path))
    assert "differ" in printed and "same" not in printed


def test_a_pipe_feeds_the_next_command(generate, tmp_path):
    (tmp_path / "f").write_text("1\n2\n3\n4\n")
    assert generate.run_line("cat f | tail -2", str(tmp_path)) == "3\n4\n"
    assert generate.run_line("specbatch profiles | head -1", str(tmp_path)).startswith("profile ")


@pytest.mark.parametrize("line", ["cat a; rm -rf b", "cat a > b", "rm a", "cat a || echo no", "FOO=1 cat a",
                                  "cat $(ls)", "bash -c ls"])
def test_lines_outside_the_small_language_are_refused(generate, tmp_path, line):
    with pytest.raises(ValueError):
        generate.run_line(line, str(tmp_path))


def test_pythonpath_reaches_specbatch_in_process_and_is_undone(generate, tmp_path):
    (tmp_path / "pe").mkdir()
    (tmp_path / "pe" / "docgen_probe.py").write_text("raise ImportError('probe imported')\n")
    saved = list(sys.path)
    printed = generate.run_line("PYTHONPATH=pe specbatch run --policy docgen_probe:X --num-requests 2", str(tmp_path))
    assert "probe imported" in printed
    assert sys.path == saved and "docgen_probe" not in sys.modules
    printed = generate.run_line("specbatch run --policy docgen_probe:X --num-requests 2", str(tmp_path))
    assert "No module named 'docgen_probe'" in printed


def test_a_backslash_continues_a_command(generate, tmp_path):
    block = _block(generate, tmp_path, "<!-- generated: console -->", "$ echo one \\\n    two\nold\n")
    assert generate.console(block) == "```console\n$ echo one \\\n    two\none two\n```\n"


def test_checkout_paths_are_shown_relative(generate, tmp_path):
    block = _block(generate, tmp_path, "<!-- generated: console -->",
                   "$ specbatch profiles cpu-tinyllama-1.1b-llama-68m\n")
    fresh = generate.console(block)
    assert "(sim/profiles/cpu-tinyllama-1.1b-llama-68m)" in fresh and str(ROOT) not in fresh


def test_echo_status_prints_the_previous_exit_code(generate, tmp_path):
    block = _block(generate, tmp_path, "<!-- generated: console -->",
                   "$ specbatch run --rate 0\n$ echo $?\n$ echo $?\n")
    fresh = generate.console(block)
    assert fresh.endswith("$ echo $?\n2\n$ echo $?\n0\n```\n")


def test_regress_timings_are_not_compared(generate):
    a = "[1/10] continuous-fixed: 0.26 s\nPASS"
    assert generate.masked(a) == generate.masked(a.replace("0.26", "1.5"))


def test_stderr_can_be_dropped_and_nothing_else_redirected(generate, tmp_path):
    assert generate.run_line("specbatch run --rate 0 2>/dev/null", str(tmp_path)) == ""
    assert "must be greater than 0" in generate.run_line("specbatch run --rate 0", str(tmp_path))
    assert generate.run_line("cat nope 2>/dev/null && echo no", str(tmp_path)) == ""
    for line in ("cat a 2>b", "cat a 1>/dev/null", "cat a 2>/dev/null x"):
        with pytest.raises(ValueError):
            generate.run_line(line, str(tmp_path))


def test_stderr_is_not_piped(generate, tmp_path):
    """As in a shell: `cmd | grep x` filters cmd's stdout; its stderr (warnings, errors) still shows."""
    printed = generate.run_line("specbatch run --rate 0 | grep nothing-matches", str(tmp_path))
    assert printed.startswith("error: --rate: workload.rate: must be greater than 0")
    (tmp_path / "f").write_text("a\nb\n")
    assert generate.run_line("cat f missing | tail -1", str(tmp_path)).startswith("cat: missing")


def test_engine_speed_table_orders_the_cases_and_compares_them(generate):
    """The README's Speed block comes from engine_speed.py's JSON: rows in the cases' order whatever the
    file's, steps/s to three figures, the headline rows' whole process in bold, the ratios between cases."""
    engine_speed = generate._load_doc_module("benchmarks/engine_speed.py")

    def row(case, steps, engine_s, whole_s, load, requests=10_000):
        return {"case": case, "label": f"the {case} case", "policy": "`p`", "requests": requests, "steps": steps,
                "engine_s": engine_s, "engine_steps_per_s": steps / engine_s, "whole_process_s": whole_s,
                "requests_per_s": requests / whole_s, "load_average": load}

    doc = {"date": "2026-01-02", "command": "python benchmarks/engine_speed.py --update", "requests": 10_000,
           "repeats": 3, "machine": {"cpu": "CPU", "cores": 2, "python": "3.11", "numpy": "2"},
           "rows": [row("goodput", 9_000, 0.02, 0.7, 3.0), row("v0", 8_000, 0.01, 0.6, 1.04),
                    row("step-by-step", 10_000, 0.4, 1.5, 2.0), row("fixed", 10_000, 0.04, 0.8, 1.5),
                    row("real-run", 123_456, 0.1, 0.975, 1.2, requests=16_800)]}
    lines = engine_speed.table(doc).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:7]] == [
        "| the real-run case", "| the fixed case", "| the v0 case", "| the step-by-step case", "| the goodput case"]
    assert lines[2] == "| the real-run case | `p` | 16,800 | 123,456 | 1,230,000 steps/s | **0.97 s** |"
    assert lines[3] == "| the fixed case | `p` | 10,000 | 10,000 | 250,000 steps/s | **0.80 s** |"
    assert lines[4] == "| the v0 case | `p` | 10,000 | 8,000 | 800,000 steps/s | 0.60 s |"
    assert lines[8] == ("On these runs vllm-v1 runs 0.31× the v0 scheduler's engine steps/s on the same requests; "
                        "a whole run compiled runs 10× the engine steps/s of one stepped in Python; "
                        "`goodput` runs 1.80× fixed k's engine steps/s.")
    assert lines[9].startswith("Measured 2026-01-02 with `python benchmarks/engine_speed.py --update` (best of 3) "
                               "on CPU (2 cores), Python 3.11, numpy 2")
    assert lines[9].endswith("load average of 1.0–3.0 during the runs.")
    alone = engine_speed.table({**doc, "rows": [row("fixed", 10_000, 0.04, 0.8, 1.5)]}).splitlines()
    assert "On these runs" not in "\n".join(alone) and alone[-1].endswith("load average of 1.5 during the runs.")


def test_engine_speed_results_hold_what_the_readme_says_of_them(generate):
    """benchmarks/results/engine_speed.json as engine_speed.py --update writes it: every case once, the
    figures consistent with each other, the cases that say so at the fixed case's rate."""
    import json

    engine_speed = generate._load_doc_module("benchmarks/engine_speed.py")
    CASES, REAL_PROFILE = engine_speed.CASES, engine_speed.REAL_PROFILE
    doc = json.loads((ROOT / "benchmarks" / "results" / "engine_speed.json").read_text())
    by = {r["case"]: r for r in doc["rows"]}
    assert sorted(by) == sorted(CASES) and len(doc["rows"]) == len(CASES)
    for name, r in by.items():
        case = CASES[name]
        assert r["label"] == case.label and r["policy"] == case.policy_label and r["replicas"] == case.replicas
        assert r["requests"] == (16_800 if name == "real-run" else doc["requests"])
        assert r["engine_steps_per_s"] == pytest.approx(r["steps"] / r["engine_s"])
        assert r["requests_per_s"] == pytest.approx(r["requests"] / r["whole_process_s"])
        assert 0 < r["engine_s"] < r["whole_process_s"]
        if case.rate_of:
            assert r["rate"] == by[case.rate_of]["rate"]
    assert by["real-run"]["profile"] == REAL_PROFILE
    assert (by["fixed"]["scheduler"], by["v0"]["scheduler"]) == ("vllm-v1", "v0")
    assert by["replicas"]["rate"] == pytest.approx(4 * by["fixed"]["rate"])


def test_the_first_run_notes_are_not_part_of_a_block(generate):
    """A block regenerated on a machine that has not compiled the engine yet shows what every later
    run prints: without sim.jit's one-off notes, and nothing else dropped."""
    from sim.jit import FIRST_RUN_NOTES

    text = "Simulated 10 requests\n"
    for note in FIRST_RUN_NOTES:
        assert generate.as_on_a_warm_machine(note + "\n" + text) == text
    assert generate.as_on_a_warm_machine("note: something else\n" + text) == "note: something else\n" + text
