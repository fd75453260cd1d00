"""The one TOML line locator (sim/tomlsource.py) that config, regress and sweep share."""

from __future__ import annotations

import pytest

from sim.errors import InputError
from sim.tomlsource import KeyLines, parse_toml

TEXT = """\
seed = 1                          # 1
[engine]                          # 2
batching = "static"               # 3
max_batch_size = 0                # 4
[workload]                        # 5
rate = 2.0                        # 6
prompt_tokens = { dist = "uniform", low = 1, high = 9 }   # 7
output_tokens = [                 # 8
  "not = a key",                  # 9
]                                 # 10
acceptance.alpha = 0.5            # 11
"quoted.key" = 1                  # 12
[ output ]                        # 13
[[scenario]]                      # 14
name = "a"                        # 15
[[scenario]]                      # 16
name = "b"                        # 17
[scenario.overrides]              # 18
workload = { rate = 0 }           # 19
engine.max_batch_size = 3         # 20
"""


@pytest.mark.parametrize("path,line", [
    ("seed", 1),
    ("engine", 2),
    ("engine.max_batch_size", 4),            # a nested key: its own line, not [engine]'s
    ("engine.kv_cache_tokens", 2),           # not written: its table's header
    ("workload.prompt_tokens", 7),
    ("workload.prompt_tokens.low", 7),       # inside an inline table: that line
    ("workload.output_tokens", 8),
    ("workload.acceptance.alpha", 11),       # a dotted key
    ("workload.quoted.key", 12),             # a quoted key with a dot reads as its dotted name
    ("output", 13),
    ("nowhere.at.all", None),
    (("scenario", 0, "name"), 15),           # [[arrays of tables]] by index
    (("scenario", 1, "name"), 17),
    (("scenario", 1, "overrides", "workload", "rate"), 19),  # inline table under an array's sub-table
    (("scenario", 1, "overrides", "engine", "max_batch_size"), 20),
    (("scenario", 1, "overrides", "engine", "prefill"), 18),  # not written: the nearest written parent
])
def test_key_lines_find_the_keys_own_line(path, line):
    assert KeyLines(TEXT).find(path) == line


def test_lines_inside_a_multiline_value_are_not_keys():
    lines = KeyLines("a = [\n  { b = 1 },\n]\nb = 2\n")
    assert lines.find("b") == 4 and lines.find("a.b") == 1


def test_parse_toml_error_is_one_line_with_the_line_number():
    with pytest.raises(InputError) as info:
        parse_toml("seed = 1\n[engine\n", "f.toml")
    assert info.value.source == "f.toml" and info.value.line == 2
    assert str(info.value).startswith("f.toml:2: not valid TOML")


@pytest.mark.parametrize("command,text,line,field", [
    ("sweep", '[scenario]\nseed = 1\nworkload = { rate = 0, num_requests = 5 }\n[axes]\nseed = [0, 1]\n', 3,
     "workload.rate"),
    ("sweep", '[scenario.engine]\nbatching = "static"\nmax_batch_size = 0\n[axes]\nseed = [0, 1]\n', 3,
     "engine.max_batch_size"),
    ("sweep", '[scenario]\nengine.max_batch_size = 0\n[axes]\nseed = [0, 1]\n', 2, "engine.max_batch_size"),
    ("regress", 'format = 1\n[[scenario]]\nname = "a"\n[scenario.overrides]\nseed = 1\nworkload = { rate = 0 }\n'
     '[scenario.expected]\ncompleted = 1\n', 6, "workload.rate"),
    ("regress", 'format = 1\n[[scenario]]\nname = "a"\n[scenario.overrides]\nengine.max_batch_size = 0\n'
     '[scenario.expected]\ncompleted = 1\n', 5, "engine.max_batch_size"),
])
def test_sweep_and_regress_files_name_the_keys_own_line(tmp_path, capsys, command, text, line, field):
    from specbatch.commands.cli import main

    path = tmp_path / "file.toml"
    path.write_text(text)
    args = [command, str(path), "--out", str(tmp_path / "out")] if command == "sweep" else \
        [command, "--baseline", str(path)]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}:{line}: {field}: ")
    assert not (tmp_path / "out").exists()
