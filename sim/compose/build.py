"""Compose a whole profile: every grid point priced, the sidecar with every assumption, written atomically."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from sim.atomic_write import staged_dir
from sim.compose import data
from sim.compose.heads import HeadPricer, HeadShape
from sim.compose.interp import running_max
from sim.compose.mla import CONTEXT_TABLE as MLA_CONTEXT, GENERATION_TABLE as MLA_GENERATION, MlaModule
from sim.compose.mla import shape_problem as mla_shape_problem
from sim.compose.moe import ExpertsTable
from sim.compose.parallel import GRAPH_TOKENS, Collectives, newest
from sim.compose.price import KV_BYTES, KernelTables, PassPricer
from sim.compose.sampler import SAMPLING_MODES, SORT_SOURCE
from sim.compose.shapes import TP_SIZES, ModelShape
from sim.compose.fitted import EXPOSED_OVERHEAD_S, REQUEST_LATENCY_S, REQUEST_LATENCY_SOURCE  # noqa: F401 (compose's)
from sim.errors import InputError
from sim.costmodel.profile import COLUMNS, CSV_NAME, META_NAME, write_profile

SIGNIFICANT = 4  # digits kept per latency: the kernel tables are not more precise, and the files stay small
MEMORY_FRACTION = 0.9  # vLLM's default gpu_memory_utilization
ENGINE_OVERHEAD_S = 1.21e-3
ENGINE_OVERLAP = "async"
ENGINE_OVERHEAD_SOURCE = (
    "published, not measured here: vLLM's engine work per step (scheduling, input preparation, "
    "sampling bookkeeping), 1.21 ms in the step-time fit of SpecDecode-Bench (arXiv 2601.11580; "
    "Llama-3.1-8B on H100, vLLM 0.10-0.11, synchronous scheduling). vLLM V1 schedules asynchronously "
    "by default (vLLM PR #27614, v0.12 on): the CPU prepares step n + 1 while the GPU runs step n, "
    "so a step takes max(passes, 1.21 ms) (overlap: async), not their sum (the composed batch-1 decode of "
    "Llama-3.1-8B is within 2% of that fit's 5.89 ms GPU step); the part no overlap hides is fitted apart "
    "(exposed_overhead_s, request latency below). "
    "Override with --engine-overhead-ms / --engine-overlap, or fit to your own measurements (specbatch fit)")
NOT_MODELLED = (
    "eager launches (the tables time kernels back to back, as CUDA graphs replay them; no per-kernel launch gap "
    "is added); the padding of a step to vLLM's CUDA-graph sizes is the cost model's (vllm-v1 scheduler)",
    "pipeline and expert parallelism (a replica is one tensor-parallel group of one node's GPUs)",
    "overlap of the all-reduces with computation (vLLM runs them between the layers' kernels by default)",
    "kernel fusion beyond vLLM's fused QKV, gate/up and residual-add + RMSNorm",
    "fp8 KV cache (the KV cache is bf16)",
    "chunked-prefill kernels (a chunk is priced from the prefill curve, plus its attention to its cached prefix "
    "by the cost model)",
)


@dataclass(frozen=True)
class Request:
    """What to compose: GPU data, the model shapes (whole, unsplit), how they are split over the
    replica's GPUs, and the grid points (phase, model, b, q, c). No draft: a target-only profile."""

    gpu: str
    framework: str
    framework_version: str
    dtype: str  # "bf16", "fp8" (per-tensor) or "fp8-block" (DeepSeek's 128 x 128 blocks)
    target: ModelShape
    draft: ModelShape | None
    points: tuple[tuple[str, str, int, int, int], ...]
    grid: dict[str, Any]
    model_configs: dict[str, dict[str, Any]]  # the published configs, recorded as they are
    kernel_data: str | None = None
    memory_fraction: float = MEMORY_FRACTION
    engine_overhead_s: float = ENGINE_OVERHEAD_S
    engine_overlap: str = ENGINE_OVERLAP  # "async": the engine's work overlaps the passes; "none": it adds
    engine_overhead_source: str = ENGINE_OVERHEAD_SOURCE
    request_latency_s: float = REQUEST_LATENCY_S
    exposed_overhead_s: float = EXPOSED_OVERHEAD_S
    request_latency_source: str = REQUEST_LATENCY_SOURCE
    name: str | None = None
    command: str = ""  # the command line that regenerates this profile, recorded in the sidecar
    tp: int = 1  # GPUs per replica: the target's tensor-parallel size
    draft_tp: int | None = None  # the draft's: the target's group (None, vLLM's default) or one GPU of it (1)
    moe_routing: str = "balanced"  # the routing distribution the MoE table is read at (sim.compose.moe)
    heads: tuple[HeadShape, ...] = ()  # drafter heads priced beside the draft model (sim/compose/heads.py)
    host_points: tuple[tuple[str, int, int, int, float], ...] = ()  # host proposers' measured (model, b, k, c, s)
    host_timing: dict[str, Any] | None = None  # where and how they were timed (calibrate.host)
    sampling: str = "greedy"  # what vLLM's sampler does per step (sim.compose.sampler): greedy, random, top-p

    @property
    def draft_gpus(self) -> int:
        return self.tp if self.draft_tp is None else self.draft_tp

    def shapes(self) -> dict[str, ModelShape]:
        """Each model as one GPU of its group holds it (the target on all ``tp``, the draft on its own)."""
        out = {"target": self.target.sharded(self.tp)}
        if self.draft is not None:
            out["draft"] = self.draft.sharded(self.draft_gpus)
        return out


def load_tables(request: Request) -> tuple[KernelTables, Path, str]:
    """Read the tables once; unknown GPU / framework / version / dtype is one line listing the data's."""
    root = data.systems_dir(request.kernel_data)
    if request.dtype not in data.GEMM_DTYPES:
        raise InputError(f"'{request.dtype}' is not one of {', '.join(data.GEMM_DTYPES)}", field="dtype")
    args = (root, request.gpu, request.framework, request.framework_version)
    gemm = data.read_table(*args, data.GEMM_TABLE)
    context = data.read_table(*args, data.CONTEXT_TABLE)
    generation = data.read_table(*args, data.GENERATION_TABLE)
    gemm_dtype = data.GEMM_DTYPES[request.dtype]
    dtypes = sorted(set(gemm.gemm_dtype))
    if gemm_dtype not in dtypes or "bfloat16" not in dtypes:
        raise InputError(f"no {gemm_dtype} GEMMs for {request.framework} {request.framework_version} on "
                         f"{request.gpu} (it has: {', '.join(dtypes)})", field="dtype")
    spec = data.read_gpu_spec(root, request.gpu)
    device = str(gemm["device"].iloc[0]) if "device" in gemm.columns else request.gpu
    return KernelTables.from_frames(spec, gemm, context, generation, gemm_dtype), root, device


def make_pricers(request: Request, tables: KernelTables, root: Path) -> dict[str, PassPricer]:
    """Each model's pass pricer, with its group's collectives and its experts' table where it needs them."""
    shapes = request.shapes()
    groups = sorted({shape.tp for shape in shapes.values() if shape.tp > 1})
    collectives = {gpus: load_collectives(request, tables, root, gpus) for gpus in groups}
    args = (root, request.gpu, request.framework, request.framework_version)
    moe = data.read_table(*args, data.MOE_TABLE) if any(s.is_moe for s in shapes.values()) else None
    mla = load_mla(request, tables, args) if any(s.is_mla for s in shapes.values()) else None
    out = {}
    for role, shape in shapes.items():
        experts = None
        if shape.is_moe:
            experts = ExpertsTable.from_frame(moe, hidden=shape.hidden_size, intermediate=shape.intermediate_size,
                                              experts=shape.num_experts, top_k=shape.experts_per_token, tp=shape.tp,
                                              dtype=request.dtype, routing=request.moe_routing,
                                              source=f"the {request.gpu} MoE table")
            tables.kernels[f"experts_{role}"] = experts.kernel
        out[role] = PassPricer(shape, tables, collectives.get(shape.tp), experts, request.sampling,
                               mla if shape.is_mla else None)
    return out


def load_mla(request: Request, tables: KernelTables, args: tuple) -> MlaModule:
    """The latent-attention module's tables (sim/compose/mla.py); a shape they did not measure is one line."""
    for role, shape in request.shapes().items():
        problem = shape.is_mla and mla_shape_problem(shape)
        if problem:
            raise InputError(problem[1], field=problem[0], source=request.model_configs[role].get("source") or None)
    source = f"the {request.gpu} MLA module tables"
    module = MlaModule.from_frames(data.read_table(*args, MLA_CONTEXT), data.read_table(*args, MLA_GENERATION),
                                   request.dtype, source)
    tables.kernels["mla_module"] = module.backend
    return module


def load_collectives(request: Request, tables: KernelTables, root: Path, gpus: int) -> Collectives:
    """The all-reduce (the framework's) and all-gather (the newest NCCL's) tables of a group of ``gpus``."""
    args = (root, request.gpu, request.framework, request.framework_version)
    all_reduce = data.read_table(*args, data.ALL_REDUCE_TABLE)
    versions = data.nccl_versions(root, request.gpu)
    if not versions:
        raise InputError(f"no NCCL collectives measured on {request.gpu} (comm/nccl/ in the kernel data)", field="tp")
    sheet = tables.spec.nccl_version  # the spec sheet names the system's NCCL; else the newest measured
    nccl_version = sheet if sheet in versions else newest(versions)
    nccl = data.read_table(root, request.gpu, data.NCCL, nccl_version, data.NCCL_TABLE)
    measured = sorted(set(all_reduce.num_gpus.astype(int)) & set(nccl.num_gpus.astype(int)))
    if gpus not in measured:
        raise InputError(f"the {request.gpu} data measured collectives of {', '.join(map(str, measured))} GPUs, "
                         f"not {gpus}", field="tp")
    sources = {"all_reduce": f"{request.framework} {request.framework_version} "
                             f"{', '.join(sorted(set(all_reduce.kernel_source)))}",
               "all_gather": f"NCCL {nccl_version} (nccl-tests)",
               "all_reduce_floor": (f"NCCL {nccl_version} all_reduce (nccl-tests)"
                                    if ((nccl.op_name == "all_reduce") & (nccl.num_gpus == gpus)).any() else "none")}
    return Collectives.from_frames(gpus, all_reduce, nccl, sources)


def kv_capacity(request: Request, spec: data.GpuSpec) -> dict[str, int]:
    """KV tokens that fit beside the models' weights under vLLM's memory utilization, on every GPU.

    vLLM gives every GPU of a group the same number of KV blocks, each GPU holding its share of
    each token's KV (its KV heads), so the replica's cache is the sum of the GPUs' free memory
    over the bytes a token takes on them all. Every figure here is one GPU's: the one the
    draft's weights and KV sit on when it runs on one GPU of the group (that GPU sets the count).
    """
    weight = data.WEIGHT_BYTES[request.dtype]
    shapes = request.shapes()
    weights = sum(shape.weight_bytes(weight) for shape in shapes.values())
    budget = int(request.memory_fraction * spec.mem_capacity)
    per_token = sum(shape.kv_bytes_per_token(KV_BYTES) for shape in shapes.values())
    nccl = spec.nccl_reserve(request.tp)
    free = budget - weights - spec.reserved_bytes - nccl
    if free < per_token:
        names = " + ".join(shape.name for shape in shapes.values())
        remedy = ("split it over more GPUs (--tp)" if request.tp < max(TP_SIZES) else
                  f"one node's {max(TP_SIZES)} GPUs are the most a replica is priced on: take a GPU with more memory")
        raise InputError(f"{names} ({weights / 2**30:.1f} GiB of weights per GPU over {request.tp} GPU(s)) "
                         f"leave no room for a KV cache in {request.memory_fraction:g} of the {request.gpu}'s "
                         f"{spec.mem_capacity / 2**30:.0f} GiB; {remedy}", field="target")
    return {"available_bytes": spec.mem_capacity, "budget_bytes": budget, "fraction": request.memory_fraction,
            "weight_bytes": weights, "reserved_bytes": spec.reserved_bytes, "nccl_bytes": nccl,
            "kv_bytes_per_token": per_token, "gpus": request.tp, "per": "GPU", "kv_capacity_tokens": free // per_token}


def check_priceable(pricers: dict[str, PassPricer], request: Request) -> None:
    """A shape the tables cannot price even with the equivalences is one line, before any work."""
    context = min((c for phase, model, _, _, c in request.points if phase == "decode" and model == "target"),
                  default=128)
    prompt = min((q for phase, model, _, q, _ in request.points if phase == "prefill" and model == "target"),
                 default=128)
    for role, pricer in pricers.items():
        shape = pricer.model
        for what, parts in (("decode", pricer.decode_parts(1, 1, context, 1)),
                            ("prefill", pricer.prefill_parts(1, prompt))):
            bad = [name for name, value in parts.items() if not np.isfinite(value).all()]
            if bad:
                raise InputError(
                    f"the {request.gpu} tables cannot price {role} model {shape.name}'s {what} {bad[0]} "
                    f"(heads {shape.num_heads}, KV heads {shape.num_kv_heads}, head_dim {shape.head_dim}, "
                    f"hidden {shape.hidden_size}, ffn {shape.intermediate_size}), even with the work-unit "
                    f"equivalence", field=role)


def price_points(request: Request, pricers: dict[str, PassPricer]) -> tuple[pd.DataFrame, dict]:
    """One row per grid point: ``ok``, or ``error`` (off the kernel tables); the verify points once more
    for every sampling (sim/compose/sampler.py), so that a run prices the one its requests ask for.

    Points whose KV would not fit the capacity are priced too (a calibration would record them
    ``oom``): a run never reaches them, but it does reach the steps between them and the points
    that fit, which the cost model interpolates between the two; a corner filled by the roofline
    fit instead priced those steps up to 16% high (Llama-2-7b on H100, batch 64-128 at 1-2k tokens)."""
    frame = pd.DataFrame(list(request.points), columns=["phase", "model", "batch_size", "query_tokens",
                                                        "context_tokens"])
    frame = frame[frame.model.isin(list(pricers))].reset_index(drop=True)  # a target-only profile: no draft rows
    verify = frame[(frame.phase == "verify") & (frame.model == "target")]
    frame = pd.concat([frame, *(verify.assign(model=mode) for mode in SAMPLING_MODES)], ignore_index=True)
    latency = np.full(len(frame), np.nan)
    off_table: dict[str, dict[str, int]] = {}
    for (phase, model), rows in frame.groupby(["phase", "model"], sort=False):
        pricer = pricers[model if model in pricers else "target"]
        b, q, c = (rows[col].to_numpy(dtype=float) for col in ("batch_size", "query_tokens", "context_tokens"))
        if phase == "prefill":
            parts = pricer.prefill_parts(b, q)
        elif phase == "decode":
            parts = pricer.decode_parts(b, q, c, None if model == "target" else 1)
        else:  # verify / target: the profile's sampling; verify / <mode>: each other a run may ask for
            parts = {"verify": pricer.verify(b, q, model if model in SAMPLING_MODES else None)}
        latency[rows.index] = sum(parts.values())
        for name, value in parts.items():
            missing = int((~np.isfinite(value)).sum())
            if missing:
                off_table.setdefault(f"{phase}/{model}", {})[name] = missing
    latency = monotone_envelope(frame, latency)
    status = np.where(np.isfinite(latency), "ok", "error")
    rounded = np.array([float(f"{v:.{SIGNIFICANT}g}") if np.isfinite(v) else np.nan for v in latency])
    ok = status == "ok"
    frame["status"] = status
    frame["samples"] = np.where(ok, 1, 0)
    for col in COLUMNS:
        if col.startswith("latency_"):
            frame[col] = np.where(ok, 0.0 if col == "latency_std_s" else rounded, np.nan)
    return frame[list(COLUMNS)], off_table


def monotone_envelope(frame: pd.DataFrame, latency: np.ndarray) -> np.ndarray:
    """Per (phase, model), the running maximum along batch, query tokens and context.

    The tables are already fitted monotone (:class:`~sim.compose.interp.LogTable`), but one
    axis after another leaves small dips across axes, and where a pass switches between equivalences (one launch of more sequences or several launches,
    at a table's edge) the sum can dip by a few percent; a pass with more work never takes
    less time, so the dip is lifted to its smaller neighbour's time.
    """
    out = latency.copy()
    for _, rows in frame.groupby(["phase", "model"], sort=False):
        axes = [np.unique(rows[a].to_numpy()) for a in ("batch_size", "query_tokens", "context_tokens")]
        cube = np.full(tuple(a.size for a in axes), np.nan)
        index = tuple(np.searchsorted(a, rows[name].to_numpy()) for a, name in
                      zip(axes, ("batch_size", "query_tokens", "context_tokens")))
        cube[index] = latency[rows.index]
        out[rows.index] = running_max(cube)[index]
    return out


def assumptions(request: Request, tables: KernelTables) -> list[str]:
    spec = tables.spec
    return [
        "each pass = per layer its GEMMs at m = batch x query tokens (fused QKV, O, gate/up, down; OPT: "
        "QKV, out, fc1, fc2) + attention + memory-bound small ops, plus the LM head and the embedding",
        "interpolation is log-linear between measured points of each table; a point outside a table's "
        "measured range is not priced (status 'error') and never extrapolated",
        "more work never takes less time: each table is replaced along each size axis by its least-squares "
        "non-decreasing fit (isotonic regression in log time; single kernels vary by 5-10 %), then the composed "
        "grid is lifted to its running maximum along batch, query tokens and context",
        "decode attention work units: b sequences x H_kv KV heads cost what b*H_kv/h0 sequences with h0 KV "
        f"heads and the same query heads per KV head cost (h0 = H_kv where the table has it, else "
        f"{8}: multi-head models): the same KV bytes read in the same number of (sequence, KV head) work "
        "units; on H100 the tables that measure 32-KV-head attention directly (SGLang's FlashAttention 3, "
        "TensorRT-LLM's) agree with the mapping within their own noise (docs/gpu-profiles.md)",
        "verification: q query tokens per sequence over context c are priced as one decode-attention pass "
        "with q x (query heads per KV head) over KV length c + q (FlashAttention packs them into one tile of "
        "rows and reads the KV once); a tile holds 64 rows per KV head, each further tile re-reads the KV "
        "(priced as more sequences); within a tile, past the table's widest head count, the pass is priced at "
        "that count (the tables are flat in head count at a given KV size)",
        "decode attention past the generation table's KV-size edge (batch x KV length): b sequences are priced "
        "as n launches of b / n sequences (each reads only its own KV; the tables are linear in batch there)",
        "GEMMs wider than the table's largest n (the LM head) are split into equal column blocks; narrower than "
        "its smallest (a mixture of experts' router) priced at the smallest (the launch and the activations' "
        "read: an upper bound)",
        "LM head: over every query token of a target decode/verify pass, over the last token of a draft "
        "pass and of a prefill; it stays bf16 with --dtype fp8",
        "small ops (norms, rotary, activation, residual adds, embedding, KV-cache write) are memory-bound: "
        f"bytes / ({spec.mem_bw_scaling:g} x {spec.mem_bw / 1e12:g} TB/s, the spec sheet's bandwidth and "
        "empirical factor), no launch cost (fused or inside CUDA graphs)",
        sampling_assumption(request, spec),
        f"KV capacity: {request.memory_fraction:g} of the GPU's memory (vLLM's gpu_memory_utilization) minus "
        "the models' weights minus the sheet's reserve for activations and CUDA graphs (other_mem); points "
        "whose KV (batch x (context + query)) exceeds it are priced all the same (a run never reaches them, "
        "but the steps between them and points that fit are interpolated between the two)",
        *parallel_assumptions(request),
        *experts_assumptions(request, tables),
        *mla_assumptions(request, tables),
        *(line for shape in request.shapes().values() for line in shape.assumptions()),
        f"engine overhead: {request.engine_overhead_source}",
        f"request latency and exposed time per step: {request.request_latency_source}",
        *head_assumptions(request),
        *(f"not modelled: {what}" for what in NOT_MODELLED),
    ]


def sampling_assumption(request: Request, spec) -> str:
    """The sidecar's line on what the sampler does per step (sim/compose/sampler.py)."""
    if request.sampling == "greedy":
        return ("sampling (vLLM V1's sampler): the target's bf16 logits at its k+1 positions cast to fp32 (read 2 "
                "bytes, write 4 an element), then a greedy argmax at k = 0 (read 4) or the rejection sampler at k >= 1 "
                "(reads fp32 probabilities of k+1 target and k draft positions), all over the vocabulary at the same "
                f"bandwidth, plus 2 x {spec.mem_latency_s * 1e6:g} us (the sheet's constant latency of a memory-bound "
                "kernel: the cast and the sampling kernel)")
    top_p = ("; then " + SORT_SOURCE + ", interpolated log-log in positions x vocabulary, scaled from the H100's "
             "bandwidth to this GPU's"
             if request.sampling == "top-p" else "")
    return (f"sampling '{request.sampling}' (vLLM V1's sampler at temperature > 0, sim/compose/sampler.py; vLLM samples "
            "as a request asks, else as the model's generation_config.json says, --generation-config auto): the "
            "target's bf16 logits at its k+1 positions cast to fp32 (read 2 bytes, write 4 an element), divided by the "
            "temperature (read and write 4) and a softmax (read 8, write 4) at each position" + top_p + "; a token drawn "
            "at each position by the exponential race (write 4, divide: read 8 write 4, argmax: read 4), and at k >= 1 "
            "the rejection sampler (reads fp32 probabilities of k+1 target and k draft positions); element passes at the same "
            f"bandwidth, each kernel {spec.mem_latency_s * 1e6:g} us (the sheet's constant latency of a memory-bound "
            "kernel)")


def parallel_assumptions(request: Request) -> list[str]:
    """What tensor parallelism adds to the assumptions (nothing on one GPU)."""
    out = []
    if request.tp > 1:
        out += [
            f"tensor parallelism over {request.tp} GPUs as vLLM splits a model: QKV and gate/up column-parallel, "
            "attention output and down row-parallel, attention heads and KV heads split (KV heads replicated to one "
            "per GPU when fewer than the GPUs), experts split along their intermediate size, embedding and LM head "
            "vocabulary-parallel; every GPU runs the same kernels at once, so a pass costs one GPU's kernels at "
            "its share of the shapes plus the collectives",
            "collectives: two all-reduces per layer and one after the embedding, of tokens x hidden bf16 elements, "
            "from the kernel data's vLLM all-reduce table for this GPU count (CUDA-graph captured up to "
            f"{GRAPH_TOKENS} tokens a step, eager above, as vLLM runs them), each at least NCCL's all-reduce of "
            "the same message (nccl-tests: a synchronising collective; in a running model every all-reduce follows "
            "GPU-local work and waits for the slowest GPU, where the framework's table replays them back to back "
            "on GPUs that arrive together; the skew beyond that handshake is not priced); the logits' all-gather (tokens with "
            "logits x vocabulary) from its NCCL table (the spec sheet's NCCL version where the data has it); messages "
            "past a table's largest as equal parts",
            f"KV capacity with {request.tp} GPUs: vLLM gives every GPU the same number of KV blocks, each holding "
            "its KV heads of each token, so the replica holds the GPUs' free memory summed over a token's bytes "
            "on them all; each GPU also keeps NCCL's buffers (the spec sheet's nccl_mem for this group size); "
            "the memory figures in the sidecar are one GPU's",
        ]
    if request.draft is not None and request.tp > 1:
        out.append(f"draft placement: {draft_placement(request)}")
    return out


def draft_placement(request: Request) -> str:
    if request.draft_gpus == request.tp:
        return (f"the draft runs in the target's group of {request.tp} GPUs, split the same way with its own "
                "collectives (vLLM's default: the draft's tensor-parallel size is the target's)")
    return (f"the draft runs unsplit on one GPU of the target's {request.tp} (draft_tensor_parallel_size 1): its "
            "passes need no collectives, its weights and KV sit on that GPU, which sets every GPU's KV block "
            "count; sending its proposals to the other GPUs (a few token ids per sequence) is not priced")


def experts_assumptions(request: Request, tables: KernelTables) -> list[str]:
    moe = [(role, shape) for role, shape in request.shapes().items() if shape.is_moe]
    return [f"{role} {shape.name}: a mixture of {shape.num_experts} experts, top {shape.experts_per_token}, in "
            + (f"{shape.num_layers - shape.dense_layers} of {shape.num_layers} layers (the others a dense MLP of "
               f"intermediate size {shape.dense_intermediate_size})" if shape.dense_layers else "every layer")
            + f", priced from the MoE table's fused-experts kernel ({tables.kernels[f'experts_{role}']}) at the "
            f"step's tokens and this tensor-parallel size; routing assumed '{request.moe_routing}' (the table's "
            "token distribution over the experts: balanced = every expert the same share; a real router is less "
            "even); the router's GEMM (hidden -> experts) from the GEMM table and its top-k as a small op"
            for role, shape in moe]
def mla_assumptions(request: Request, tables: KernelTables) -> list[str]:
    return [f"{role} {shape.name}: multi-head latent attention priced as one measured block per layer (the MLA "
            f"module tables, {tables.kernels['mla_module']} with a bf16 KV cache: down and up projections, norms, "
            "rotary, cache write, attention and output projection) at the GPU's "
            f"{shape.heads} heads; the KV cache holds one {shape.kv_lora_rank + shape.qk_rope_head_dim}-wide "
            "latent per token and layer on every GPU; q query tokens are priced as one token of q x heads (the "
            "kernels share the latents across heads and tokens); long prompts from the tables' FlashAttention "
            "prefill rows" for role, shape in request.shapes().items() if shape.is_mla]


def head_assumptions(request: Request) -> list[str]:
    """The drafters' lines of the sidecar's assumptions (only those the profile prices)."""
    out = []
    if request.heads:
        out.append("drafter heads (" + ", ".join(h.method for h in request.heads) + "): one decoder layer at "
                   "the target's width priced like the target's layers (EAGLE, MTP: a 2h -> h projection every "
                   "pass; EAGLE-3: the 3h -> h fusion in a step's first pass (q >= 2), QKV over 2h, a "
                   f"{min(h.lm_rows for h in request.heads)}-row draft LM head; Medusa: k heads of an h x h "
                   "linear and an LM head each, one pass, no attention), logits for one token per sequence; "
                   "bf16 (sim/compose/heads.py)")
    if request.host_points:
        timing = request.host_timing or {}
        out.append("host proposers (" + ", ".join(sorted({p[0] for p in request.host_points})) + "): not "
                   "composed but timed on this machine's CPU by calibrate.host (" + str(timing.get("cpu", "?"))
                   + "), numpy implementations of the matchers vLLM runs (its own are numba/C++)")
    return out


def host_rows(points: tuple[tuple[str, int, int, int, float], ...]) -> pd.DataFrame:
    """Measured host proposer points as profile rows (phase ``propose``)."""
    rows = [{"phase": "propose", "model": model, "batch_size": b, "query_tokens": q, "context_tokens": c,
             "status": "ok", "samples": 1, **{col: (0.0 if col == "latency_std_s" else float(f"{t:.{SIGNIFICANT}g}"))
                                               for col in COLUMNS if col.startswith("latency_")}}
            for model, b, q, c, t in points]
    return pd.DataFrame(rows)[list(COLUMNS)]


def compose(request: Request, out: str | os.PathLike[str], progress=None) -> Path:
    """Compose and write the profile at ``out`` (atomically: a complete folder or nothing)."""
    out = Path(out)
    if out.exists() and not (out.is_dir() and set(p.name for p in out.iterdir()) <= {CSV_NAME, META_NAME}):
        raise InputError("exists and is not a profile folder; refusing to replace it", source=out, field="out")
    tables, root, device_name = load_tables(request)
    pricers = make_pricers(request, tables, root)
    check_priceable(pricers, request)
    pricers.update({head.method: HeadPricer(head, tables) for head in request.heads})
    memory = kv_capacity(request, tables.spec)
    capacity = memory.pop("kv_capacity_tokens")
    points, off_table = price_points(request, pricers)
    if request.host_points:
        points = pd.concat([points, host_rows(request.host_points)], ignore_index=True)
    weight = data.WEIGHT_BYTES[request.dtype]
    meta = {
        "name": request.name or out.name,
        "source": "composed",
        "command": request.command,
        "device": {"name": device_name, "type": "cuda", "gpu": request.gpu,
                   "memory_bytes": tables.spec.mem_capacity, "spec": tables.spec.to_dict()},
        "dtype": data.GEMM_DTYPES[request.dtype],
        "versions": {"specbatch": _version(), data.PACKAGE: data.package_version() if request.kernel_data is None
                     else None, "framework": request.framework, "framework_version": request.framework_version},
        "models": {role: {"name": shape.name, "config": request.model_configs[role], "params": shape.params,
                          "tensor_parallel_size": shape.tp, "weight_bytes": shape.weight_bytes(weight),
                          "kv_bytes_per_token": shape.kv_bytes_per_token(KV_BYTES)}
                   for role, shape in request.shapes().items()}
        | {head.method: {"name": f"{head.method} head of {head.target.name}", "config": head.config(),
                         "params": head.params, "weight_bytes": head.weight_bytes(),
                         "kv_bytes_per_token": head.kv_bytes_per_token()} for head in request.heads}
        | {model: {"name": f"{model} proposer (host)", "config": (request.host_timing or {}).get(model, {}),
                   "params": 0, "weight_bytes": 0, "kv_bytes_per_token": 0}
           for model in sorted({p[0] for p in request.host_points})},
        "tensor_parallel_size": request.tp,
        "grid": request.grid,
        "timing": {"method": "composed"},
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kv_capacity_tokens": int(capacity),
        "memory": memory,
        "engine_overhead": {"decode_overhead_s": request.engine_overhead_s,
                            "prefill_overhead_s": request.engine_overhead_s,
                            "exposed_overhead_s": request.exposed_overhead_s, "overlap": request.engine_overlap,
                            "request_latency_s": request.request_latency_s,
                            "source": request.engine_overhead_source,
                            "request_latency_source": request.request_latency_source},
        "composition": {"package": data.PACKAGE, "package_version": data.package_version(),
                        "kernel_data": "package" if request.kernel_data is None else str(request.kernel_data),
                        "gpu": request.gpu, "framework": request.framework,
                        "framework_version": request.framework_version, "dtype": request.dtype,
                        **({"sampling": request.sampling} if request.sampling != "greedy" else {}),
                        "kernels": dict(sorted(tables.kernels.items())),
                        **({"collectives": next(iter(p.collectives.sources for p in pricers.values()
                                                     if p.collectives is not None))} if request.tp > 1 else {}),
                        **({"moe_routing": request.moe_routing}
                           if any(p.model.is_moe for p in pricers.values()) else {}),
                        "assumptions": assumptions(request, tables),
                        "not_priced": off_table,
                        "statuses": {s: int(n) for s, n in points.status.value_counts().sort_index().items()}},
        "skipped": [],
    }
    if request.draft is not None and request.tp > 1:
        meta["draft_placement"] = {"tensor_parallel_size": request.draft_gpus, "summary": draft_placement(request)}
    return _write_atomically(out, meta, points)


def _write_atomically(out: Path, meta: dict, points: pd.DataFrame) -> Path:
    """The whole profile folder appears at once, or the old one stays (nothing partial written)."""
    with staged_dir(out) as staging:
        write_profile(staging, meta, points)
    return out


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specbatch")
    except PackageNotFoundError:
        return "unknown"


def points_of(grid_points: Iterable) -> tuple[tuple[str, str, int, int, int], ...]:
    """Grid points as plain tuples (anything with a ``key`` of (phase, model, b, q, c), or tuples)."""
    return tuple(tuple(getattr(p, "key", p)) for p in grid_points)
