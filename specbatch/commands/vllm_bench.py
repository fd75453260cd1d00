"""``vllm bench serve``'s habits on ``specbatch run``: its flags, its result file, pointers for the rest.

* ``--request-rate`` and ``--num-prompts`` are aliases of ``--rate`` and ``--num-requests``
  (rows of ``sim.config.KEYS``); ``--burstiness`` means what it means there.
* vLLM's random dataset (``--dataset-name random --random-input-len N --random-output-len M
  --random-range-ratio R --random-prefix-len P``) becomes the length distributions it draws
  from: prompts uniform on [floor(N(1 - R)), ceil(N(1 + R))] plus P, outputs on
  [max(1, floor(M(1 - R))), ceil(M(1 + R))], a fixed length when R = 0; vLLM's defaults
  (1024 and 128 tokens, R = 0) apply to a length not given.
* ``--percentile-metrics`` and ``--metric-percentiles`` choose the statistics printed, as in
  vLLM; ``--save-result`` writes vLLM's result JSON, flat (``--result-filename``,
  ``--result-dir``; ``--save-detailed`` adds the per-request lists), so a script written for
  ``vllm bench serve --save-result`` files reads ours.
* ``--temperature``, ``--top-p``, ``--top-k`` and ``--min-p`` say which sampler path vLLM runs
  (greedy, random or top-p: ``workload.sampling``), priced from the profile's verify points per
  sampling (sim/compose/sampler.py); vllm bench serve sends temperature 0 unless given one.
* A ``vllm bench serve`` flag with no meaning in a simulation gets one line saying what to
  use instead (:data:`POINTERS`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import InputError

DATASET_FLAGS = ("--dataset-name", "--random-input-len", "--random-output-len", "--random-range-ratio",
                 "--random-prefix-len")
RANDOM_DEFAULTS = {"input_len": 1024, "output_len": 128, "range_ratio": 0.0, "prefix_len": 0}  # vLLM's
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"  # vLLM's, for generative models
DEFAULT_METRIC_PERCENTILES = "99"

SAMPLING_KEYWORDS = ("temperature", "top_p", "top_k", "min_p")  # vllm bench serve's sampling flags, as API keywords
# vllm bench serve flags that mean nothing in a simulation, and what to use instead.
POINTERS: dict[str, str] = {
    "--model": "specbatch simulates a profile's model pair: give --profile (specbatch profiles lists them)",
    "--served-model-name": "specbatch simulates a profile's model pair: give --profile",
    "--tokenizer": "lengths are in tokens already: --prompt-tokens, --output-tokens",
    "--tokenizer-mode": "lengths are in tokens already: --prompt-tokens, --output-tokens",
    "--backend": "there is no server to send requests to: the engine is simulated",
    "--base-url": "there is no server to send requests to: the engine is simulated",
    "--host": "there is no server to send requests to: the engine is simulated",
    "--port": "there is no server to send requests to: the engine is simulated",
    "--endpoint": "there is no server to send requests to: the engine is simulated",
    "--header": "there is no server to send requests to: the engine is simulated",
    "--dataset-path": "replay real requests with --trace FILE.csv, or a vllm bench serve --save-detailed result "
                      "with --trace-vllm FILE.json",
    "--ramp-up-strategy": "a time-varying rate: --rate-profile ramp:START:END[:SECONDS] (or ramp-exp:...)",
    "--ramp-up-start-rps": "a time-varying rate: --rate-profile ramp:START:END[:SECONDS]",
    "--ramp-up-end-rps": "a time-varying rate: --rate-profile ramp:START:END[:SECONDS]",
    "--ignore-eos": "a simulated request always produces its --output-tokens",
    "--num-warmups": "the simulated engine has no warm-up; a capacity search leaves out each run's first half",
    "--label": "the run folder (--out) names the run",
    "--metadata": "config.toml records every setting of the run",
    "--append-result": "each --save-result file holds one run",
    "--profile-torch": "there is no torch in a simulated run",
    "--use-beam-search": "not simulated",
    "--logprobs": "log-probabilities are not priced",
    "--extra-body": "sampling is --temperature/--top-p/--top-k/--min-p (or --sampling greedy|random|top-p); "
                    "acceptance is --alpha",
    "--lora-modules": "LoRA is not simulated",
    "--trust-remote-code": "no model code is loaded",
    "--disable-tqdm": "specbatch run shows no progress bar",
    "--request-id-prefix": "requests.csv numbers the requests",
    "--ready-check-timeout-sec": "there is no server to wait for",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's random dataset, statistics and result-file flags, on ``specbatch run``."""
    from specbatch.commands.flags import typed

    group = parser.add_argument_group("vllm bench serve's flags (docs/compare.md)")
    group.add_argument("--dataset-name", default=None, metavar="random",
                       help="random: lengths drawn as vLLM's random dataset draws them (the --random-* flags); "
                            "real requests: --trace or --trace-vllm")
    group.add_argument("--random-input-len", type=typed("--random-input-len", int), default=None,
                       help=f"vLLM's random prompt length (default {RANDOM_DEFAULTS['input_len']})")
    group.add_argument("--random-output-len", type=typed("--random-output-len", int), default=None,
                       help=f"vLLM's random output length (default {RANDOM_DEFAULTS['output_len']})")
    group.add_argument("--random-range-ratio", type=typed("--random-range-ratio", float), default=None,
                       help="lengths uniform on [L(1 - R), L(1 + R)], R in [0, 1) (default 0: fixed lengths)")
    group.add_argument("--random-prefix-len", type=typed("--random-prefix-len", int), default=None,
                       help="tokens added to every prompt (default 0)")
    group.add_argument("--temperature", type=typed("--temperature", float), default=None,
                       help="the requests' temperature: 0 (vllm bench serve's default) samples greedily; sets "
                            "--sampling with --top-p/--top-k (docs/gpu-profiles.md#sampling-a-runs-choice)")
    group.add_argument("--top-p", type=typed("--top-p", float), default=None,
                       help="the requests' top-p: under 1 at a positive temperature, vLLM 0.15 sorts the vocabulary")
    group.add_argument("--top-k", type=typed("--top-k", int), default=None,
                       help="the requests' top-k: above 0 at a positive temperature, priced as the top-p sort")
    group.add_argument("--min-p", type=typed("--min-p", float), default=None,
                       help="the requests' min-p (within the sampler's element passes)")
    group.add_argument("--percentile-metrics", default=None, metavar="ttft,tpot,itl,e2el",
                       help=f"the latencies whose statistics are printed and saved (default {DEFAULT_PERCENTILE_METRICS})")
    group.add_argument("--metric-percentiles", default=None, metavar="P,P,...",
                       help=f"the percentiles printed and saved, e.g. 50,90,99 (default {DEFAULT_METRIC_PERCENTILES})")
    group.add_argument("--save-result", action="store_true",
                       help="also write vllm bench serve's result JSON (flat): --result-filename, --result-dir")
    group.add_argument("--save-detailed", action="store_true",
                       help="with --save-result: add the per-request input_lens, output_lens, ttfts and errors")
    group.add_argument("--result-filename", default=None,
                       help="the result file's name (default specbatch-RATEqps[-concurrencyN]-MODEL.json)")
    group.add_argument("--result-dir", default=None, help="the result file's folder (default: here)")


DATASET_KEYWORDS = ("dataset_name", "random_input_len", "random_output_len", "random_range_ratio",
                    "random_prefix_len")  # the flags' names as API keywords


def dataset_overrides(given: dict[str, Any], given_lengths: bool) -> dict[str, tuple[Any, str]]:
    """vLLM's random dataset (``given``: DATASET_KEYWORDS -> value or None) as length overrides;
    none given, none returned."""
    named = {k[len("random_"):]: v for k, v in given.items() if k.startswith("random_") and v is not None}
    name = given.get("dataset_name")
    if name is None and not named:
        return {}
    if name not in (None, "random"):
        raise InputError(dataset_pointer(name), source="--dataset-name")
    source = "--dataset-name" if not named else f"--random-{next(iter(named)).replace('_', '-')}"
    if given_lengths:
        raise InputError("give vLLM's random dataset or --prompt-tokens/--output-tokens, not both", source=source)
    return random_lengths(source=source, **{**RANDOM_DEFAULTS, **named})


def sampling_overrides(given: dict[str, Any], sampling_given: bool) -> dict[str, tuple[Any, str]]:
    """vllm bench serve's sampling flags (``given``: SAMPLING_KEYWORDS -> value or None) as the sampling
    vLLM's sampler runs (sim.compose.sampler.sampling_of); none given, none returned."""
    named = {k: v for k, v in given.items() if v is not None}
    if not named:
        return {}
    from sim.compose.sampler import sampling_of  # (with the shapes of every model: only where sampling is given)

    source = f"--{next(iter(named)).replace('_', '-')}"
    if sampling_given:
        raise InputError("give --sampling or vllm bench serve's --temperature/--top-p/--top-k/--min-p, not both",
                         source=source)
    checks = {"temperature": (0.0, math.inf), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0)}
    for name, (low, high) in checks.items():
        value = named.get(name)
        if value is not None and not (low <= value <= high and (name != "top_p" or value > 0)):
            bounds = "(0, 1]" if name == "top_p" else f"[{low:g}, {high:g}]"
            raise InputError(f"must be in {bounds}, got {value:g}", source=f"--{name.replace('_', '-')}")
    if named.get("top_k") is not None and named["top_k"] < -1:
        raise InputError(f"must be -1 or 0 (off) or a positive count, got {named['top_k']}", source="--top-k")
    return {"workload.sampling": (sampling_of(**{k: given.get(k) for k in SAMPLING_KEYWORDS}), source)}


def random_lengths(input_len: int, output_len: int, range_ratio: float, prefix_len: int,
                   source: str) -> dict[str, tuple[Any, str]]:
    """The length specs of vLLM's random dataset (its RandomDataset's sampling ranges)."""
    if not 0 <= range_ratio < 1:
        raise InputError(f"must be in [0, 1), got {range_ratio:g}", source="--random-range-ratio")
    for name, value, least in (("input-len", input_len, 1), ("output-len", output_len, 1), ("prefix-len", prefix_len, 0)):
        if value < least:
            raise InputError(f"must be at least {least}, got {value}", source=f"--random-{name}")

    def spec(length: int, plus: int, floor: int) -> str:
        low = max(floor, math.floor(length * (1 - range_ratio))) + plus
        high = max(low, math.ceil(length * (1 + range_ratio)) + plus)
        return str(low) if low == high else f"uniform:{low}:{high}"

    return {"workload.prompt_tokens": (spec(input_len, prefix_len, 0), source),
            "workload.output_tokens": (spec(output_len, 0, 1), source)}


def selection(args: argparse.Namespace) -> tuple[list[str], list[float]] | None:
    """The metrics and percentiles asked for, checked; None when neither flag is given."""
    if args.percentile_metrics is None and args.metric_percentiles is None:
        return None
    metrics = [m.strip() for m in (args.percentile_metrics or DEFAULT_PERCENTILE_METRICS).split(",") if m.strip()]
    bad = [m for m in metrics if m not in PERCENTILE_METRICS]
    if bad or not metrics:
        raise InputError(f"'{args.percentile_metrics}': metrics are {', '.join(PERCENTILE_METRICS)}",
                         source="--percentile-metrics")
    text = args.metric_percentiles or DEFAULT_METRIC_PERCENTILES
    try:
        percentiles = [float(p) for p in text.split(",")]
    except ValueError:
        raise InputError(f"'{text}' is not comma-separated numbers, e.g. 50,90,99", source="--metric-percentiles") from None
    if not percentiles or not all(0 < p < 100 for p in percentiles):
        raise InputError(f"'{text}': each percentile must be inside (0, 100)", source="--metric-percentiles")
    return metrics, percentiles


def result_path(args: argparse.Namespace, config) -> Path | None:
    """Where --save-result writes (checked before the run), or None without it."""
    if not args.save_result:
        if args.result_filename or args.result_dir or args.save_detailed:
            flag = "--result-filename" if args.result_filename else "--result-dir" if args.result_dir else "--save-detailed"
            raise InputError("applies only with --save-result", source=flag)
        return None
    if args.result_filename:
        name = args.result_filename
    else:
        w = config.workload
        rate = "inf" if w.rate == math.inf else f"{w.rate:g}"
        concurrency = f"-concurrency{w.max_concurrency}" if w.max_concurrency is not None else ""
        name = f"specbatch-{rate}qps{concurrency}-{Path(config.profile).name}.json"
    return Path(args.result_dir or ".") / name


def peaks(result) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests``: the most tokens emitted, and
    the most requests active, in one-second buckets from the first arrival."""
    r, steps = result.request_columns, result.step_columns
    start = float(np.min(r["arrival_s"]))
    finish = r["finish_s"][~np.isnan(r["finish_s"])]
    seconds = int(math.ceil(float(finish.max()) - start)) + 1 if finish.size else 1
    bucket = np.clip((np.asarray(steps["end_s"]) - start).astype(np.int64), 0, seconds - 1)
    tokens = np.bincount(bucket, weights=np.asarray(steps["emitted_tokens"], dtype=float), minlength=seconds)
    first = (r["arrival_s"] - start).astype(np.int64)
    last = np.nan_to_num(r["finish_s"] - start, nan=seconds - 1).astype(np.int64)
    active = np.cumsum(np.bincount(first, minlength=seconds + 1)[:seconds + 1]
                       - np.bincount(np.minimum(last + 1, seconds), minlength=seconds + 1)[:seconds + 1])[:seconds]
    return float(tokens.max()), int(active.max())


def result_document(result, metrics: list[str], percentiles: list[float], detailed: bool) -> dict[str, Any]:
    """vllm bench serve's --save-result JSON for a simulated run: its settings, then its metrics, flat."""
    from specbatch.commands.outputs import bench_serve_names, latency_statistics

    s, cfg = result.summary, result.config
    names = bench_serve_names(result)
    models = {role: m.get("name") for role, m in result.profile.meta.get("models", {}).items()}
    top_tokens, top_requests = peaks(result)
    completed = int(s["completed"])
    doc: dict[str, Any] = {
        "backend": "specbatch", "endpoint_type": "specbatch", "label": None,
        "model_id": models.get("target"), "tokenizer_id": models.get("target"),
        "num_prompts": names["num_prompts"], "request_rate": names["request_rate"],
        "burstiness": names["burstiness"], "max_concurrency": names["max_concurrency"],
        "duration": s["duration_s"], "completed": completed, "failed": result.request_count - completed,
        "total_input_tokens": s["total_input_tokens"], "total_output_tokens": s["total_output_tokens"],
        "request_throughput": s["request_throughput"], "request_goodput": names["request_goodput"],
        "output_throughput": s["output_throughput"], "total_token_throughput": s["total_token_throughput"],
        "max_output_tokens_per_s": top_tokens, "max_concurrent_requests": top_requests,
        **latency_statistics(result, metrics, percentiles),
        "profile": cfg.profile, "policy": {"name": cfg.policy.name, **cfg.policy.params},
        "config_digest": cfg.digest(),
    }
    if detailed:
        r = result.request_columns
        doc.update({"input_lens": [int(v) for v in r["prompt_tokens"]],
                    "output_lens": [int(v) for v in r["output_tokens"]],
                    "ttfts": [float(v) for v in r["ttft_s"]], "errors": [""] * result.request_count})
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in doc.items()}


def write_result(path: Path, result, metrics: list[str], percentiles: list[float], detailed: bool) -> None:
    import json

    from sim.atomic_write import write_file

    write_file(path, json.dumps(result_document(result, metrics, percentiles, detailed)) + "\n")


def pointer(argv: list[str]) -> str | None:
    """One line for the first vllm bench serve flag among ``argv`` that a simulation has no use for."""
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag in POINTERS:
            return f"{flag} is vllm bench serve's; {POINTERS[flag]}"
        if flag == "--dataset-name" and "=" in token and token.split("=", 1)[1] != "random":
            return "--dataset-name " + dataset_pointer(token.split("=", 1)[1])
    return None


def dataset_pointer(name: str) -> str:
    return (f"'{name}' is not simulated: specbatch draws vLLM's random dataset (--dataset-name random); "
            f"for real requests give --trace FILE.csv or --trace-vllm RESULT.json")


def default_selection() -> tuple[list[str], list[float]]:
    return DEFAULT_PERCENTILE_METRICS.split(","), [float(DEFAULT_METRIC_PERCENTILES)]
