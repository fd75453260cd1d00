"""Run configuration (sim/config.py): shipped defaults < TOML file < flags, with precise errors."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from policies import make_policy
from sim.config import Source, load_config
from sim.errors import InputError
from workloads import LengthSpec


def _file(tmp_path, text, name="run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _expect_error(path, overrides=None) -> InputError:
    with pytest.raises(InputError) as info:
        load_config(path, overrides)
    return info.value


# ---------------------------------------------------------------------------------------------- layering


def test_shipped_defaults_load():
    shipped = tomllib.loads((resources.files("sim") / "scenarios" / "default.toml").read_text())
    cfg = load_config()
    assert cfg.seed == shipped["seed"] and cfg.profile == shipped["profile"]
    w = shipped["workload"]
    assert (cfg.workload.arrival, cfg.workload.rate, cfg.workload.burstiness) == (
        w["arrival"], w["rate"], w["burstiness"])
    assert cfg.workload.duration_s == w["duration_s"] and cfg.workload.num_requests is None
    assert cfg.workload.prompt_tokens.to_dict() == w["prompt_tokens"]
    assert cfg.workload.output_tokens.to_dict() == w["output_tokens"]
    assert cfg.engine.batching == shipped["engine"]["batching"]
    assert cfg.engine.max_batch_size == shipped["engine"]["max_batch_size"]
    policy = dict(shipped["policy"])
    assert cfg.policy.name == policy.pop("name") and cfg.policy.params == policy
    assert cfg.acceptance.alpha == shipped["acceptance"]["alpha"]
    assert cfg.output.records == shipped["output"]["records"]
    assert cfg.sources["workload.rate"] == Source("defaults")


def test_file_overrides_defaults_and_flags_override_the_file(tmp_path):
    path = _file(tmp_path, "seed = 5\n"
                           "[workload]\n"
                           "rate = 2.0\n"
                           "prompt_tokens = \"uniform:8:16\"\n"
                           "[engine]\n"
                           "max_batch_size = 8\n")
    cfg = load_config(path, {"workload.rate": (3.0, "--rate"), "seed": (None, "--seed")})
    assert cfg.workload.rate == 3.0  # flag beats file
    assert cfg.seed == 5  # a flag left unset (None) does not override
    assert cfg.engine.max_batch_size == 8  # file beats defaults
    assert cfg.workload.prompt_tokens == LengthSpec("uniform", low=8, high=16)
    assert cfg.acceptance.alpha == load_config().acceptance.alpha  # untouched keys keep defaults
    assert cfg.sources["workload.rate"] == Source("--rate")
    assert cfg.sources["engine.max_batch_size"] == Source(str(path), 6)
    assert cfg.sources["seed"] == Source(str(path), 1)


def test_flags_alone_override_defaults():
    cfg = load_config(None, {"engine.batching": ("static", "--batching"), "acceptance.alpha": (0.55, "--alpha"),
                             "engine.scheduler": ("v0", "--scheduler")})
    assert cfg.engine.batching == "static" and cfg.acceptance.alpha == 0.55


def test_missing_config_file_is_an_input_error(tmp_path):
    err = _expect_error(tmp_path / "absent.toml")
    assert "no such config file" in str(err) and err.source == str(tmp_path / "absent.toml")


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("text,key,line", [
    ("seed = 1\n[workload]\nrate = 2.0\nrat = 3.0\n", "workload.rat", 4),
    ("seed = 1\nsede = 2\n", "sede", 2),
    ("[engine]\nmax_batch_size = 4\n\n[policy]\nname = \"fixed\"\n[acceptance]\nalfa = 0.5\n", "acceptance.alfa", 7),
    ("seed = 1\n\n[worklaod]\nrate = 2\n", "worklaod", 3),
    ("seed = 1\nengine.max_batchsize = 3\n", "engine.max_batchsize", 2),
])
def test_unknown_key_names_the_key_file_and_line(tmp_path, text, key, line):
    path = _file(tmp_path, text)
    err = _expect_error(path)
    assert (err.field, err.source, err.line) == (key, str(path), line)
    assert str(err) == f"{path}:{line}: {key}: unknown setting"


@pytest.mark.parametrize("text,key,line,message", [
    ("[workload]\nrate = 0\n", "workload.rate", 2, "must be greater than 0"),
    ("[workload]\narrival = \"gamma\"\nrate = -1.5\n", "workload.rate", 3, "must be greater than 0"),
    ("seed = 1\n[acceptance]\nalpha = 1.5\n", "acceptance.alpha", 3, "must be inside (0, 1)"),
    ("[engine]\nbatching = \"foo\"\n", "engine.batching", 2, "'foo' is not one of continuous, static"),
    ("[engine]\n# comment\nmax_batch_size = 0\n", "engine.max_batch_size", 3, "must be at least 1"),
    ("seed = 1.5\n", "seed", 1, "'1.5' is not a whole number"),
    ("seed = true\n", "seed", 1, "not a whole number"),
    ("\nseed = -1\n", "seed", 2, "must be at least 0"),
    ("[workload]\nduration_s = 0\n", "workload.duration_s", 2, "must be greater than 0"),
    ("[workload]\narrival = \"weibull\"\n", "workload.arrival", 2, "not one of poisson, gamma"),
    ("[workload]\nprompt_tokens = \"uniform:5\"\n", "workload.prompt_tokens", 2, "uniform:LOW:HIGH"),
    ("[workload]\noutput_tokens = { dist = \"lognormal\", mean = 9 }\n", "workload.output_tokens", 2,
     "needs mean, sigma"),
    ("[workload]\nrate = 1\n[workload.prompt_tokens]\ndist = \"fixed\"\nvalue = 0\n", "workload.prompt_tokens", 3,
     "at least 1"),
    ("[acceptance]\ndistribution = \"gauss\"\n", "acceptance.distribution", 2, "not one of fixed, beta"),
    ("[acceptance]\nconcentration = 0\n", "acceptance.concentration", 2, "greater than 0"),
    ("[output]\nrecords = \"json\"\n", "output.records", 2, "not one of csv, parquet, none"),
    ("profile = \"\"\n", "profile", 1, "non-empty string"),
    ("[workload]\nrate = \"fast\"\n", "workload.rate", 2, "'fast' is not a number"),
])
def test_bad_value_in_file_names_field_file_and_line(tmp_path, text, key, line, message):
    path = _file(tmp_path, text)
    err = _expect_error(path)
    assert (err.field, err.source, err.line) == (key, str(path), line)
    assert message in err.message
    assert str(err).startswith(f"{path}:{line}: {key}: ")


@pytest.mark.parametrize("key,value,flag,message", [
    ("workload.rate", 0.0, "--rate", "must be greater than 0"),
    ("acceptance.alpha", 1.5, "--alpha", "must be inside (0, 1)"),
    ("engine.batching", "foo", "--batching", "not one of"),
    ("engine.max_batch_size", 0, "--max-batch-size", "must be at least 1"),
    ("seed", "abc", "--seed", "'abc' is not a whole number"),
    ("workload.prompt_tokens", "lognormal:1", "--prompt-tokens", "not a length"),
])
def test_bad_value_from_a_flag_names_the_flag(tmp_path, key, value, flag, message):
    path = _file(tmp_path, "seed = 3\n[workload]\nrate = 2.0\n[engine]\nmax_batch_size = 4\n")
    err = _expect_error(path, {key: (value, flag)})
    assert (err.field, err.source, err.line) == (key, flag, None)
    assert message in err.message
    assert str(err).startswith(f"{flag}: {key}: ")


def test_invalid_toml_reports_its_line(tmp_path):
    path = _file(tmp_path, "seed = 1\n[workload]\nrate = 2\nburstiness = = 3\n")
    err = _expect_error(path)
    assert (err.source, err.line) == (str(path), 4)
    assert "not valid TOML" in err.message


def test_duration_and_num_requests_in_one_file_is_an_error(tmp_path):
    path = _file(tmp_path, "[workload]\nduration_s = 10.0\nrate = 1.0\nnum_requests = 50\n")
    err = _expect_error(path)
    assert (err.field, err.source, err.line) == ("workload.num_requests", str(path), 4)
    assert "not both" in err.message


def test_num_requests_in_a_file_replaces_the_default_duration(tmp_path):
    cfg = load_config(_file(tmp_path, "[workload]\nnum_requests = 50\n"))
    assert (cfg.workload.num_requests, cfg.workload.duration_s) == (50, None)


def test_num_requests_flag_replaces_a_files_duration(tmp_path):
    path = _file(tmp_path, "[workload]\nduration_s = 30.0\n")
    cfg = load_config(path, {"workload.num_requests": (20, "--num-requests")})
    assert (cfg.workload.num_requests, cfg.workload.duration_s) == (20, None)


def test_duration_flag_replaces_a_files_num_requests(tmp_path):
    path = _file(tmp_path, "[workload]\nnum_requests = 20\n")
    cfg = load_config(path, {"workload.duration_s": (12.5, "--duration")})
    assert (cfg.workload.num_requests, cfg.workload.duration_s) == (None, 12.5)


# ---------------------------------------------------------------------------------------------- policy


def test_defaults_give_fixed_policy_with_k():
    cfg = load_config()
    assert cfg.policy.name == "fixed" and cfg.policy.params == {"k": 3}


def test_policy_flag_drops_the_defaults_policy_params():
    cfg = load_config(None, {"policy.name": ("none", "--policy")})
    assert cfg.policy.name == "none" and cfg.policy.params == {}
    assert make_policy(cfg.policy.name, cfg.policy.params).max_k == 0  # 'none' must not be given k


def test_policy_name_in_a_file_drops_the_defaults_policy_params(tmp_path):
    cfg = load_config(_file(tmp_path, "[policy]\nname = \"none\"\n"))
    assert cfg.policy.params == {}


def test_policy_flag_drops_the_files_policy_params_but_keeps_param_flags(tmp_path):
    path = _file(tmp_path, "[policy]\nname = \"fixed\"\nk = 6\n")
    cfg = load_config(path, {"policy.name": ("fixed", "--policy"), "policy.k": (2, "--k")})
    assert cfg.policy.params == {"k": 2}
    cfg = load_config(path, {"policy.name": ("none", "--policy"), "policy.k": (None, "--k")})
    assert cfg.policy.params == {}


def test_policy_params_from_the_policy_table_reach_policy_config(tmp_path):
    cfg = load_config(_file(tmp_path, "[policy]\nname = \"mypkg.mod:Smart\"\nthreshold = 0.25\nwindow = 8\n"))
    assert cfg.policy.name == "mypkg.mod:Smart"
    assert cfg.policy.params == {"threshold": 0.25, "window": 8}


def test_policy_param_without_a_name_keeps_the_earlier_policy(tmp_path):
    cfg = load_config(_file(tmp_path, "[policy]\nk = 5\n"))
    assert cfg.policy.name == "fixed" and cfg.policy.params == {"k": 5}


# ---------------------------------------------------------------------------------------------- round trip, digest


RICH = """seed = 17
profile = "some/profile/dir"

[workload]
arrival = "gamma"
rate = 3.5
burstiness = 0.4
num_requests = 250
prompt_tokens = "uniform:16:512"
output_tokens = 64

[engine]
scheduler = "v0"
batching = "static"
max_batch_size = 12
kv_cache_tokens = 40000

[policy]
name = "fixed"
k = 5

[acceptance]
alpha = 0.62
distribution = "beta"
concentration = 4.0

[output]
dir = "runs/x"
records = "parquet"
"""


@pytest.mark.parametrize("text", [RICH, None], ids=["rich", "defaults"])
def test_to_toml_round_trips_to_an_equal_config(tmp_path, text):
    cfg = load_config(_file(tmp_path, text) if text else None)
    again = load_config(_file(tmp_path, cfg.to_toml(), "resolved.toml"))
    assert again == cfg
    assert again.to_toml() == cfg.to_toml()


def test_round_trip_keeps_every_rich_setting(tmp_path):
    cfg = load_config(_file(tmp_path, RICH))
    assert cfg.workload.burstiness == 0.4 and cfg.workload.num_requests == 250
    assert cfg.engine.kv_cache_tokens == 40000 and cfg.acceptance.distribution == "beta"
    assert cfg.output.dir == "runs/x" and cfg.policy.params == {"k": 5}


def test_digest_ignores_output_dir_but_changes_with_seed(tmp_path):
    path = _file(tmp_path, RICH)
    base = load_config(path)
    assert load_config(path).digest() == base.digest()
    moved = load_config(path, {"output.dir": ("elsewhere", "--out")})
    assert moved.output.dir == "elsewhere" and moved.digest() == base.digest()
    reseeded = load_config(path, {"seed": (18, "--seed")})
    assert reseeded.digest() != base.digest()
    assert load_config(path, {"workload.rate": (3.6, "--rate")}).digest() != base.digest()


def test_naming_the_same_policy_again_keeps_the_earlier_params(tmp_path):
    path = _file(tmp_path, "[policy]\nname = \"fixed\"\nk = 5\n")
    cfg = load_config(path, {"policy.name": ("fixed", "--policy")})
    assert cfg.policy.params == {"k": 5}
    assert cfg.sources["policy.k"].where == str(path)


def test_a_new_policy_forgets_where_the_dropped_params_came_from(tmp_path):
    path = _file(tmp_path, "[policy]\nname = \"fixed\"\nk = 5\n")
    cfg = load_config(path, {"policy.name": ("mine:Policy", "--policy")})
    assert "policy.k" not in cfg.sources


def test_duration_and_num_requests_flags_together_are_an_error():
    err = _expect_error(None, {"workload.duration_s": (60.0, "--duration"),
                               "workload.num_requests": (10, "--num-requests")})
    assert err.format() == "--num-requests: workload.num_requests: give either --duration or --num-requests, not both"


def test_digest_follows_the_trace_contents_not_only_its_path(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n")
    flags = {"workload.trace": (str(trace), "--trace")}
    before = load_config(None, flags).digest()
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,6\n")
    assert load_config(None, flags).digest() != before


# ---------------------------------------------------------------------------------------------- the key table and the locator


@pytest.mark.parametrize("text,key,line", [
    ("seed = 1\n[engine]\nbatching = \"static\"\nmax_batch_size = 0\n", "engine.max_batch_size", 4),
    ("seed = 1\nengine.max_batch_size = 0\n", "engine.max_batch_size", 2),
    ("seed = 1\n\nworkload = { rate = 0 }\n", "workload.rate", 3),
    ("seed = 1\n[workload]\narrival = \"poisson\"\n\n[engine]\nmax_batch_size = 2\n[workload.prompt_tokens]\n"
     "dist = \"fixed\"\nvalue = 0\n", "workload.prompt_tokens", 7),
])
def test_a_bad_key_is_named_at_its_own_line(tmp_path, text, key, line):
    path = _file(tmp_path, text)
    err = _expect_error(path)
    assert (err.field, err.source, err.line) == (key, str(path), line)


def test_overrides_may_be_plain_values():
    cfg = load_config(None, {"workload.rate": 0.2, "engine.max_batch_size": 4, "seed": None})
    assert cfg.workload.rate == 0.2 and cfg.engine.max_batch_size == 4 and cfg.seed == load_config().seed
    assert cfg.sources["workload.rate"] == Source("overrides")
    err = _expect_error(None, {"workload.rate": -1})
    assert str(err) == "overrides: workload.rate: must be greater than 0, got -1"
    assert str(_expect_error(None, {"workload.rat": 1})) == "overrides: workload.rat: unknown setting"


def test_the_key_table_is_the_one_list_of_settings():
    import dataclasses

    from specbatch.commands.flags import RUN_FLAGS
    from sim.config import KEYS, KNOWN, SECTION_TYPES, flatten_sections

    cfg = load_config()
    for section, cls in SECTION_TYPES.items():  # the sections' fields are the table's keys
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields == {k.field for k in KEYS if k.section == section and k.value is not None}, section
    assert {k.name for k in KEYS if k.value is not None} == KNOWN
    assert {flag: key for flag, (key, _, _) in RUN_FLAGS.items()} == {k.flag: k.name for k in KEYS if k.flag}
    # The shipped defaults file sets every required key and nothing else (policy parameters aside).
    shipped = flatten_sections(tomllib.loads((resources.files("sim") / "scenarios" / "default.toml").read_text()))
    required = {k.name for k in KEYS if k.value is not None and not k.value.optional}
    assert required <= set(shipped) | {"workload.rate_profile"}
    assert {k for k in shipped if not k.startswith("policy.")} <= KNOWN
    assert cfg.to_dict().keys() <= {k.section or k.name for k in KEYS}


@pytest.mark.parametrize("name,key", [("rate", "workload.rate"), ("num_requests", "workload.num_requests"),
                                      ("max-batch-size", "engine.max_batch_size"), ("k", "policy.k"),
                                      ("policy", "policy.name"), ("workload.cv", "workload.cv"), ("nope", "nope")])
def test_key_for_maps_flag_and_keyword_names(name, key):
    from sim.config import key_for

    assert key_for(name) == key


def test_to_toml_is_byte_identical_to_the_format_before_the_key_table(tmp_path):
    """The resolved config.toml names run folders (its digest): the table must write it as before (once
    changed on purpose: a v0 run records its scheduler since vllm-v1 became the default)."""
    from tests.conftest import CPU_DEFAULTS  # the scenario the expected bytes were recorded on

    scenario = tmp_path / "cpu.toml"  # less its burstiness line: this config sets cv instead
    scenario.write_text("".join(line for line in CPU_DEFAULTS.read_text().splitlines(keepends=True)
                                if not line.startswith("burstiness")))
    cfg = load_config(scenario, {"workload.cv": 2.0, "workload.arrival": "gamma", "cluster.replicas": 2,
                                     "workload.duration_s": 1200.0, "output.timeline": "t.json",
                                     "output.timeline_window": "1:2.5"})
    assert cfg.to_toml() == (
        'seed = 0\nprofile = "cpu-tinyllama-1.1b-llama-68m"\n\n[workload]\narrival = "gamma"\nrate = 0.1\ncv = 2.0\n'
        'duration_s = 1200.0\n\n[workload.prompt_tokens]\ndist = "lognormal"\nmean = 128.0\nsigma = 0.5\nmax = 512\n\n'
        '[workload.output_tokens]\ndist = "lognormal"\nmean = 128.0\nsigma = 0.5\nmax = 512\n\n[engine]\n'
        'batching = "continuous"\nmax_batch_size = 32\nprefill = "packed"\nscheduler = "v0"\n\n[policy]\nname = "fixed"\n'
        'k = 3\n\n'
        '[acceptance]\nalpha = 0.7\ndistribution = "fixed"\nconcentration = 10.0\n\n[output]\nrecords = "csv"\n'
        'timeline = "t.json"\ntimeline_window = "1.0:2.5"\n\n[cluster]\nreplicas = 2\nrouter = "round-robin"\n')


@pytest.mark.parametrize("overrides", [{"workload.burstiness": (0.5, "--burstiness")}, {"workload.cv": (2.0, "--cv")},
                                       {"workload.burstiness": 0.5}])
def test_burstiness_other_than_one_means_gamma_arrivals(overrides):
    """As in vllm bench serve: a burstiness over the default Poisson arrivals is never ignored."""
    config = load_config(None, overrides)
    assert config.workload.arrival == "gamma" and config.workload.burstiness == 0.5 - (0.25 if "workload.cv" in
                                                                                           overrides else 0)
    assert 'arrival = "gamma"' in config.to_toml()


def test_burstiness_one_keeps_poisson_arrivals():
    assert load_config(None, {"workload.burstiness": (1.0, "--burstiness")}).workload.arrival == "poisson"


def test_a_flag_s_burstiness_turns_a_file_s_poisson_arrivals_gamma(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[workload]\narrival = "poisson"\nburstiness = 1.0\n')
    assert load_config(path, {"workload.burstiness": (0.5, "--burstiness")}).workload.arrival == "gamma"


def test_poisson_and_burstiness_asked_for_together_contradict(tmp_path):
    with pytest.raises(InputError) as info:
        load_config(None, {"workload.arrival": ("poisson", "--arrival"), "workload.burstiness": (0.5, "--burstiness")})
    assert str(info.value) == ("--arrival: workload.arrival: poisson arrivals have burstiness 1, but burstiness is "
                               "0.5 (set at --burstiness): drop one (burstiness other than 1 means gamma arrivals, "
                               "as in vllm bench serve)")
    path = tmp_path / "s.toml"
    path.write_text('[workload]\narrival = "poisson"\nburstiness = 0.5\n')
    with pytest.raises(InputError, match=r"s.toml:2: workload.arrival: .* \(set at .*s.toml:3\)"):
        load_config(path)
