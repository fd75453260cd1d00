"""``specbatch compose``: a profile for a GPU you do not have, from published kernel microbenchmarks.

It resolves the models to published shapes (``calibrate.configs.get_config``: a built-in name,
a Hugging Face ``config.json`` or its folder, or a Hugging Face id), builds the same
grid ``calibrate --device cuda`` would measure (same grid flags), and hands plain shapes
and points to :mod:`sim.compose`. Everything is checked before any work; the profile is
written atomically. Imported when the parser is built: top-level imports stay light.
"""

from __future__ import annotations

import argparse

COMPOSE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # powers of two keep the shipped files small
# Prompts from one token: a vllm-v1 step's chunks and its CUDA-graph padding are priced on the one-prompt
# prefill curve at a few to a few hundred tokens (sim/costmodel/model.py), where a GEMM's rows still matter.
COMPOSE_MIN_PROMPT = 1
DEFAULT_MAX_LEN = 32768  # longest context composed by default (the models may accept more)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specbatch.commands.flags import typed

    p.add_argument("--gpu", required=True, help="GPU of the kernel data, e.g. h100_sxm, h200_sxm, l40s, a100_sxm")
    p.add_argument("--target", required=True,
                   help="target model: a built-in name (calibrate --list-models), a Hugging Face config.json or "
                        "its folder, or a Hugging Face id in the local cache or shipped with aiconfigurator-core")
    p.add_argument("--draft", default=None,
                   help="draft model, as --target (none: a target-only profile, on which only --policy none runs)")
    p.add_argument("--out", required=True, help="output profile folder (replaced atomically)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="GPUs per replica: the target's tensor-parallel size, 1, 2, 4 or 8 (default: %(default)s)")
    p.add_argument("--draft-tp", type=int, default=None, metavar="N",
                   help="the draft's: the target's group (default, as vLLM runs a draft model) or 1 (one GPU of it)")
    p.add_argument("--moe-routing", default="balanced", metavar="NAME",
                   help="a mixture of experts: which of the MoE table's routing distributions to read, balanced "
                        "(every expert the same share of the tokens) or a skewed power law (default: %(default)s)")
    p.add_argument("--framework", default="vllm", help="framework whose kernels were measured (default: %(default)s)")
    p.add_argument("--framework-version", default=None,
                   help="its version in the data (default: the newest the data has for the GPU)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp8", "fp8-block"),
                   help="GEMM and expert weights (default: %(default)s; fp8: the per-tensor fp8 GEMM and MoE "
                        "tables; fp8-block: 128 x 128 block-scaled fp8, as DeepSeek-V3 ships)")
    p.add_argument("--kernel-data", default=None, metavar="DIR",
                   help="a folder laid out like aiconfigurator-core's systems/ (default: the installed package)")
    p.add_argument("--memory-fraction", type=typed("--memory-fraction", float), default=None,
                   help="share of GPU memory for weights + KV cache (default 0.9, vLLM's gpu_memory_utilization)")
    p.add_argument("--engine-overhead-ms", type=typed("--engine-overhead-ms", float), default=None,
                   help="the engine's own work per step (default 1.21 ms, a published vLLM figure)")
    from sim.compose.fitted import EXPOSED_OVERHEAD_S, REQUEST_LATENCY_S

    p.add_argument("--request-latency-ms", type=float, default=None,
                   help="the serving frontend's latency per request, added to TTFT and E2E (default "
                        f"{REQUEST_LATENCY_S * 1e3:.3f} ms, fitted on real vLLM runs, docs/validation.md)")
    p.add_argument("--exposed-overhead-ms", type=float, default=None,
                   help=f"the engine's time per step no overlap hides (default {EXPOSED_OVERHEAD_S * 1e3:g} ms: "
                        "fitted on real vLLM runs it is not carried, docs/validation.md)")
    p.add_argument("--engine-overlap", choices=("async", "none"), default=None,
                   help="async: that work overlaps the passes, a step takes the longer (vLLM V1's default "
                        "asynchronous scheduling); none: it adds to them (default: async)")
    from sim.compose.sampler import SAMPLING_MODES

    p.add_argument("--sampling", choices=SAMPLING_MODES, default="greedy",
                   help="what vLLM's sampler does each step: greedy (temperature 0, vllm bench serve's default), "
                        "random (temperature > 0, no top-k/top-p), top-p (nucleus: vLLM 0.15 sorts the vocabulary; "
                        "what a request without sampling parameters gets from a model whose generation_config.json "
                        "sets top_p, e.g. Llama 2 and 3): what a run prices unless it asks for another with "
                        "specbatch run --sampling (every mode is priced) (default: %(default)s)")
    p.add_argument("--max-len", type=int, default=None,
                   help=f"longest sequence the grid covers (default: the models' limit, at most {DEFAULT_MAX_LEN})")
    p.add_argument("--name", default=None, help="profile name in the sidecar (default: the folder's name)")
    from calibrate.grid import drafter_list

    p.add_argument("--drafters", type=drafter_list, default=None, metavar="LIST",
                   help="drafters to price besides the draft model: eagle, eagle3, mtp, medusa (heads at the "
                        "target's width, composed) and ngram, suffix (host proposers, timed on this machine's CPU); "
                        "e.g. eagle,eagle3,ngram (docs/speculation-methods.md)")
    from calibrate.cli import add_grid_axes

    g = p.add_argument_group("grid (as calibrate --device cuda; batches: powers of two up to 256, k_max 8)")
    add_grid_axes(g)
    g.add_argument("--max-prefill-tokens", type=int, metavar="N", help="skip prefill points with batch*prompt > N")


def build_request(args: argparse.Namespace):
    """Check every input and assemble the core's request (no kernel data read yet)."""
    from calibrate.configs import get_config, param_count
    from calibrate.grid import default_grid
    from sim.compose import ModelShape, Request, points_of
    from sim.compose.moe import ROUTINGS
    from sim.compose.build import (ENGINE_OVERHEAD_S, ENGINE_OVERHEAD_SOURCE, ENGINE_OVERLAP, MEMORY_FRACTION,
                                   EXPOSED_OVERHEAD_S, REQUEST_LATENCY_S, REQUEST_LATENCY_SOURCE)
    from sim.errors import InputError

    configs = {"target": get_config(args.target, "target")}
    if args.draft is not None:
        configs["draft"] = get_config(args.draft, "draft")
    shapes = {role: ModelShape.of(c, param_count(c)) for role, c in configs.items()}
    if "draft" in shapes and shapes["target"].vocab_size != shapes["draft"].vocab_size:
        raise InputError(f"the draft's vocabulary ({shapes['draft'].vocab_size}) differs from the target's "
                         f"({shapes['target'].vocab_size}): speculative decoding needs one", field="draft")
    draft_tp = check_parallel(args, shapes)
    if args.moe_routing not in ROUTINGS:
        raise InputError(f"'{args.moe_routing}' is not one of {', '.join(ROUTINGS)}", field="moe-routing")
    limit = min(c.max_position_embeddings for c in configs.values())
    max_len = min(limit, DEFAULT_MAX_LEN) if args.max_len is None else args.max_len
    if not 1 <= max_len <= limit:
        raise InputError(f"must be in 1..{limit} (the models' limit)", field="max-len")
    fraction = MEMORY_FRACTION if args.memory_fraction is None else args.memory_fraction
    if not 0 < fraction <= 1:
        raise InputError("must lie in (0, 1]", field="memory-fraction")
    overhead_ms = args.engine_overhead_ms
    if overhead_ms is not None and not overhead_ms >= 0:
        raise InputError("must be at least 0", field="engine-overhead-ms")
    latency_ms, exposed_ms = args.request_latency_ms, args.exposed_overhead_ms
    for value, field in ((latency_ms, "request-latency-ms"), (exposed_ms, "exposed-overhead-ms")):
        if value is not None and not 0 <= value <= 1000:
            raise InputError("must be from 0 to 1000 ms", field=field)
    if args.k_max is not None and args.k_max < 0:
        raise InputError("must be at least 0", field="k-max")
    grid = default_grid("cuda", max_len, batch_sizes=args.batch_sizes or COMPOSE_BATCHES,
                        query_tokens=args.query_tokens, k_max=args.k_max, contexts=args.contexts,
                        prompts=args.prompts or compose_prompts(max_len), max_prefill_tokens=args.max_prefill_tokens)
    grid_meta = {k: v for k, v in grid.to_dict().items() if k not in ("warmup", "repeats", "budget_s")}
    drafters = args.drafters or []
    from calibrate.grid import drafter_points
    from sim.compose.heads import HEAD_METHODS, HeadShape

    if args.tp > 1 and any(m in HEAD_METHODS for m in drafters):
        raise InputError("drafter heads are composed on one GPU (--tp 1): a head split over a tensor-parallel "
                         "group is not priced yet", field="drafters")
    heads = tuple(HeadShape.of(method, shapes["target"]) for method in drafters if method in HEAD_METHODS)
    head_points = tuple(drafter_points(grid, [head.method for head in heads]))
    hosts = [method for method in drafters if method not in HEAD_METHODS]
    if drafters:
        grid_meta["drafters"] = list(drafters)
    version = args.framework_version
    if version is None:
        from sim.compose import data

        version = data.newest_version(data.systems_dir(args.kernel_data), args.gpu, args.framework)
    return Request(
        gpu=args.gpu, framework=args.framework, framework_version=version, dtype=args.dtype,
        target=shapes["target"], draft=shapes.get("draft"), points=points_of(grid.points()) + head_points,
        tp=args.tp, draft_tp=draft_tp, moe_routing=args.moe_routing,
        grid={**grid_meta, "max_len": max_len}, model_configs={r: c.to_dict() for r, c in configs.items()},
        kernel_data=args.kernel_data, memory_fraction=fraction,
        engine_overhead_s=ENGINE_OVERHEAD_S if overhead_ms is None else overhead_ms * 1e-3,
        engine_overlap=args.engine_overlap or ENGINE_OVERLAP,
        engine_overhead_source=ENGINE_OVERHEAD_SOURCE if overhead_ms is None and args.engine_overlap is None else
        f"given on the command line (--engine-overhead-ms {overhead_ms if overhead_ms is not None else ENGINE_OVERHEAD_S * 1e3:g}, "
        f"--engine-overlap {args.engine_overlap or ENGINE_OVERLAP})",
        request_latency_s=REQUEST_LATENCY_S if latency_ms is None else latency_ms * 1e-3,
        exposed_overhead_s=EXPOSED_OVERHEAD_S if exposed_ms is None else exposed_ms * 1e-3,
        request_latency_source=REQUEST_LATENCY_SOURCE if latency_ms is None and exposed_ms is None else
        f"given on the command line (--request-latency-ms {REQUEST_LATENCY_S * 1e3 if latency_ms is None else latency_ms:g}, "
        f"--exposed-overhead-ms {EXPOSED_OVERHEAD_S * 1e3 if exposed_ms is None else exposed_ms:g})",
        name=args.name, command=command_line(args), heads=heads, sampling=args.sampling,
        host_points=tuple(host_points(hosts, grid)) if hosts else (),
        host_timing=host_timing(hosts) if hosts else None)


def host_points(hosts: list[str], grid) -> list[tuple[str, int, int, int, float]]:
    """The host proposers timed on this machine (calibrate.host) over the grid's batches and contexts, at
    k = 1 and k_max (the look-up does not grow with k; the two bound the copy)."""
    import sys

    from calibrate.grid import drafter_points
    from calibrate.host import time_proposer

    keys = drafter_points(grid, hosts)
    points = []
    for i, (_, method, b, k, c) in enumerate(keys, 1):
        points.append((method, b, k, c, time_proposer(method, b, k, c)))
        if sys.stderr.isatty():
            print(f"\rtiming the host proposers on this CPU: {i}/{len(keys)}", end="", file=sys.stderr)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    return points


def host_timing(hosts: list[str]) -> dict:
    from calibrate.host import NGRAM_LOOKUP, SUFFIX_DEPTH, host_info

    info = host_info()
    return {**info, **{h: {"method": h, **({"prompt_lookup": list(NGRAM_LOOKUP)} if h == "ngram" else
                                            {"max_tree_depth": SUFFIX_DEPTH}), "timed_on": info["cpu"],
                           "num_layers": 0} for h in hosts}}


def check_parallel(args: argparse.Namespace, shapes: dict) -> int | None:
    """The target's and the draft's tensor-parallel sizes, checked as vLLM checks them (one line each)."""
    from sim.errors import InputError

    problem = shapes["target"].tp_problem(args.tp)
    if problem:
        raise InputError(f"{shapes['target'].name} cannot run with {problem}", field="tp")
    if args.draft_tp is None:
        return None
    if "draft" not in shapes:
        raise InputError("a target-only profile has no draft to place; leave --draft-tp out", field="draft-tp")
    if args.draft_tp not in (1, args.tp):
        raise InputError(f"the draft runs in the target's group ({args.tp}) or on one GPU of it (1), not "
                         f"{args.draft_tp}", field="draft-tp")
    problem = shapes["draft"].tp_problem(args.draft_tp)
    if problem:
        raise InputError(f"{shapes['draft'].name} cannot run with {problem}", field="draft-tp")
    return None if args.draft_tp == args.tp else args.draft_tp


def compose_prompts(max_len: int) -> list[int]:
    """Powers of two from COMPOSE_MIN_PROMPT up to the models' limit (at most 4096, as calibrate's)."""
    top = min(4096, max_len)
    out, p = [], COMPOSE_MIN_PROMPT
    while p <= top:
        out.append(p)
        p *= 2
    return out


def command_line(args: argparse.Namespace) -> str:
    """The canonical command for these arguments (recorded in the sidecar: how to regenerate it)."""
    words = ["specbatch", "compose", "--gpu", args.gpu, "--target", args.target]
    words += ["--draft", args.draft] if args.draft is not None else []
    defaults = {"framework": "vllm", "dtype": "bf16", "tp": 1, "moe_routing": "balanced",
                "sampling": "greedy"}
    for key in ("tp", "draft_tp", "moe_routing", "framework", "framework_version", "dtype", "kernel_data",
                "memory_fraction", "engine_overhead_ms", "request_latency_ms", "exposed_overhead_ms",
                "engine_overlap", "sampling",
                "max_len", "name", "batch_sizes", "query_tokens", "k_max", "contexts", "prompts",
                "max_prefill_tokens", "drafters"):
        value = getattr(args, key)
        if value is None or defaults.get(key) == value:
            continue
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        words += [f"--{key.replace('_', '-')}", text]
    return " ".join(words + ["--out", str(args.out)])


def main(args: argparse.Namespace) -> int:
    from sim.compose import compose
    from sim.costmodel.profile import load_profile

    request = build_request(args)
    out = compose(request, args.out)
    profile = load_profile(out)
    statuses = profile.meta["composition"]["statuses"]
    counts = ", ".join(f"{n} {s}" for s, n in statuses.items())
    models = request.target.name + (f" + {request.draft.name}" if request.draft else " (target only)")
    gpus = f"{request.tp} x {args.gpu}" if request.tp > 1 else args.gpu
    print(f"Composed {profile.name}: {models} on {gpus} "
          f"({request.framework} {request.framework_version}, {args.dtype}); {counts} points; "
          f"KV capacity {profile.kv_capacity_tokens:,} tokens")
    print(f"Wrote {out}/ (profile.csv, profile.json)")
    return 0


def pricers_for(profile) -> dict:
    """The target's and draft's pass pricers a composed profile was built from, read again from
    the kernel data its sidecar's command names (needs that data: the gpu-data extra)."""
    from sim.compose.build import load_tables, make_pricers

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser)
    from sim.compose.heads import HEAD_METHODS, HeadPricer

    args = parser.parse_args(profile.meta["command"].split()[2:])
    args.drafters = [d for d in args.drafters or [] if d in HEAD_METHODS] or None  # nothing is timed again
    request = build_request(args)
    tables, root, _ = load_tables(request)
    return {**make_pricers(request, tables, root), **{head.method: HeadPricer(head, tables) for head in request.heads}}
