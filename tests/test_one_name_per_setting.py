"""Two names for one setting in one command (``--request-rate 12 --rate 5``) are refused the way
every bad input is (docs/errors.md): one line naming both, exit 2, nothing written.

The settings with several flags are taken from where their names are defined (``sim.config.KEYS``:
a flag, its aliases, a true/false setting's ``--no-`` form), so a new alias is covered here
without a new case.
"""

from __future__ import annotations

import itertools

import pytest

from specbatch.commands.flags import one_name_per_setting, spellings
from sim.config import KEYS
from sim.errors import InputError
from tests.test_bad_inputs import TINY, here, refused  # noqa: F401  (here: the working-folder fixture)

# ------------------------------------------------------------------------------ two names, one setting

# Every pair of flags that name one setting, from the key table.
PAIRS = [(key, a, b) for key in KEYS for a, b in itertools.permutations(spellings(key), 2)]


def _with_value(key, flag: str) -> list[str]:
    """``flag`` with a value its setting takes (a true/false flag takes none)."""
    if key.value is not None and key.value.type is bool:
        return [flag]
    return [flag, {"workload.rate": "5", "workload.num_requests": "4", "engine.max_batch_size": "8"}[key.name]]


def test_the_pairs_include_vllms_names_and_the_no_forms():
    names = {(a, b) for _, a, b in PAIRS}
    assert {("--request-rate", "--rate"), ("--num-prompts", "--num-requests"), ("--max-num-seqs", "--max-batch-size"),
            ("--chunked-prefill", "--no-chunked-prefill")} <= names


@pytest.mark.parametrize("key, first, second", PAIRS, ids=[f"{a}+{b}" for _, a, b in PAIRS])
def test_two_flags_for_one_setting_are_refused_naming_both(capsys, here, key, first, second):
    argv = ["run", "--profile", "p", *_with_value(key, first), *_with_value(key, second), "--out", "o"]
    line = refused(capsys, here, argv, first, second, key.name)
    assert line.index(first) < line.index(second)  # in the order given


@pytest.mark.parametrize("command", [["capacity", "--slo", "p99_ttft_ms=2000"], ["tune"], ["validate"], ["replay"],
                                     ["compare", "result.json"], ["fit", "measured.csv"]])
def test_every_command_taking_the_run_flags_refuses_two_names(capsys, here, command):
    refused(capsys, here, [*command, "--max-num-seqs", "8", "--max-batch-size", "16"], "--max-num-seqs",
            "--max-batch-size")


def test_the_same_flag_twice_and_a_flag_over_its_toml_key_still_run(capsys, here):
    (here / "c.toml").write_text("[workload]\nrate = 2\n")
    out = here / "o"
    from specbatch.commands.cli import main

    assert main(["run", "--config", str(here / "c.toml"), "--profile", str(here / "p"), *TINY,
                 "--request-rate", "3", "--request-rate", "4", "--out", str(out), "--quiet"]) == 0
    assert "rate = 4.0" in (out / "config.toml").read_text()


def test_the_python_api_refuses_two_keywords_for_one_setting(here):
    import specbatch

    with pytest.raises(InputError, match="num_prompts and num_requests both set workload.num_requests"):
        specbatch.run(profile=str(here / "p"), num_prompts=4, num_requests=5)
    assert sorted(p.name for p in here.iterdir()) == ["p", "t.csv"]


def test_names_of_different_settings_pass():
    one_name_per_setting(["--rate", "--num-requests", "--max-batch-size", "--chunked-prefill", "--out"])
