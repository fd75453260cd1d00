"""The decode step's terms measured on a GPU, and the composition's price for the same points (issue 38, item 2).

    python benchmarks/gpu_step_terms.py measure --out DIR [--budget SECONDS] [--dry-run]
    python benchmarks/gpu_step_terms.py compare [--measured FILE] [--gpu h200_sxm]

``measure`` runs on a lent GPU machine, which has torch, numpy and pandas but not the
simulator's simpy or numba: it imports torch, numpy and the project's ``calibrate`` package
only. On CUDA every point is timed with CUDA events over replays of a CUDA graph captured for
it (:func:`calibrate.timing.time_cuda`); with ``--dry-run``, or where there is no CUDA, the same
code runs on the CPU at tiny sizes in a few seconds. The sections, in this order:

* ``sampler``: the LM head and vLLM V1's sampler over a 32k and a 128k vocabulary (the
  vocabularies of Llama-2-7B and Llama-3.1-8B, hidden 4096, bf16) at batch 1-256, each term
  in its own graph: the LM head, the bf16 logits' cast to fp32, the greedy argmax, the random
  draw (temperature, softmax, exponential race), top-p as vLLM's PyTorch path runs it (a sort
  over the vocabulary) and the rejection sampler at k = 4 (:func:`calibrate.verify.verify_logits`);
* ``attention``: one layer's decode attention (one query token a sequence, 32 query heads of
  128) for grouped-query (8 KV heads) and multi-head (32) at the same KV bytes, three ways:
  the model's dense path (:func:`calibrate.attention.attend` with a mask over the longest row,
  what the calibrator ran until 2026-11-28 and still runs without the split kernel), SDPA
  without a mask, and the model's split path (flash attention's varlen kernel reading each
  row's own length); plus ragged rows, where the masked SDPA reads the longest row for every row;
* ``decode_step``: a whole Llama-3.1-8B and Llama-2-7B decode step (the pass calibration
  times, :func:`calibrate.passes.build_pass`, plus the greedy sampler) at batch 1-128 and
  contexts 512-4096;
* ``kernels``: the same decode pass taken apart, under torch's profiler: every kernel's GPU
  time, summed by what it is (matrix products, attention, the small ops between them), the
  kernels counted, and the pass's graph time beside them (what no kernel runs in is the gaps
  between kernels);
* ``floor``: the time one small kernel takes inside a CUDA graph however little it does: a graph
  of many back-to-back adds, RMSNorms and SiLU-and-multiplies at 1-1024 tokens of hidden 4096;
* ``ragged``: a target and a draft pass (the 8B and 1B pair the GPU validation replays) over 16 rows
  whose contexts differ, as a served batch's do, against the same pass with every row at their mean,
  as calibration times it: what rows of different lengths cost the split attention kernel;
* ``sustained``: the validation's target pass (16 rows, 4 tokens a row) timed three ways: as
  calibration times it (the device idle before each replay), back to back (queued, one wait at the
  end), and for most of a minute of steps as the GPU replay runs them (the draft's passes, then the
  target's, one wait a step), in windows, with the GPU's clocks, power and temperature beside each
  (nvidia-smi): whether a pass served for a minute runs slower than calibration's short bursts.

It writes ``DIR/gpu_step_terms.json`` after every point, so a run stopped by its machine keeps
what finished; a point or a section that fails is recorded with its error and the rest goes
on; ``--budget`` seconds are shared between the sections (1 : 1 : 3, what one leaves goes to
the next) and the points past a section's share are recorded as skipped; ``--sections`` runs
some of them only.

``compare`` runs here, with the whole project: for every measured point it prints the price
of the same thing from the composition ``specbatch compose --gpu GPU`` uses
(benchmarks/step_terms.py's pricer, :meth:`sim.compose.price.PassPricer.decode_parts`,
:func:`sim.compose.sampler.sampler_time`) and measured / composed.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import signal
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script on a machine where the project is not installed
    sys.path.insert(0, str(ROOT))

RESULT = "gpu_step_terms.json"
DEFAULT_MEASURED = ROOT / "benchmarks" / "results" / RESULT
SECTIONS = ("sampler", "attention", "decode_step", "kernels", "floor", "ragged", "sustained")
SHARES = {"sampler": 1.0, "attention": 1.0, "decode_step": 3.0, "kernels": 1.0, "floor": 0.5,  # of --budget
          "ragged": 1.0, "sustained": 3.0}
KERNEL_CLASSES = ("gemm", "attention", "small")
FLOOR_OPS = ("add", "rms_norm", "silu_mul")
SAMPLER_TERMS = ("lm_head", "cast", "greedy", "random", "top_p", "rejection_k4")
ATTENTION_VARIANTS = ("masked_sdpa", "sdpa", "varlen")
TEMPERATURE, TOP_P, K = 0.6, 0.9, 4  # Llama 2 and 3's generation_config.json; four drafts verified


@dataclass(frozen=True)
class Plan:
    """What ``measure`` times where (sizes, limits, timer): :data:`GPU_PLAN`, or :data:`DRY_PLAN` on a CPU."""

    device: str
    dtype: str
    warmup: int
    repeats: int
    point_budget_s: float
    sampler_models: tuple[str, ...]  # their vocabulary and hidden size: the LM head's and sampler's shapes
    sampler_batches: tuple[int, ...]
    attention_models: tuple[tuple[str, str], ...]  # (label, model): its query heads, KV heads and head size
    attention_batches: tuple[int, ...]
    contexts: tuple[int, ...]  # the first layout's; the others' hold the same KV bytes
    ragged_batches: tuple[int, ...]
    ragged_context: int
    attention_kv_limit: float  # bytes of K and V beyond which a point is skipped
    decode_models: tuple[str, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_kv_limit: float
    kernel_points: tuple[tuple[str, int, int], ...]  # (model, batch, context) of the decode passes taken apart
    floor_tokens: tuple[int, ...]
    floor_chain: int  # kernels a floor graph runs back to back
    ragged_points: tuple[tuple[str, int, int, int], ...]  # (model, rows, query tokens, mean context)
    sustained_point: tuple[str, str, int, int, int] = ("llama-3.1-8b", "llama-3.2-1b", 16, 4, 512)  # target,
    # draft, rows, query tokens (k + 1), context: a step of the GPU validation at high load
    sustained_s: float = 45.0  # the steps' run, at most (the section's share of the budget may cut it)
    window_s: float = 2.0  # the steps' times are summed up per window, the clocks read at each

    @property
    def dry_run(self) -> bool:
        return self.device != "cuda"


GPU_PLAN = Plan(device="cuda", dtype="bfloat16", warmup=2, repeats=10, point_budget_s=0.2,
                sampler_models=("llama-2-7b", "llama-3.1-8b"), sampler_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                attention_models=(("gqa", "llama-3.1-8b"), ("mha", "llama-2-7b")),
                attention_batches=(1, 4, 16, 64, 128), contexts=(1024, 4096, 16384),
                ragged_batches=(16, 64), ragged_context=4096, attention_kv_limit=20e9,
                decode_models=("llama-3.1-8b", "llama-2-7b"), decode_batches=(1, 8, 32, 64, 128),
                decode_contexts=(512, 1024, 2048, 4096), decode_kv_limit=70e9,
                kernel_points=tuple((m, b, 1024) for m in ("llama-3.1-8b", "llama-2-7b", "llama-3.2-1b")
                                    for b in (1, 8, 32, 128)),
                floor_tokens=(1, 16, 128, 1024), floor_chain=200,
                ragged_points=tuple((m, 16, q, c) for m in ("llama-3.1-8b", "llama-3.2-1b") for q in (1, 4)
                                    for c in (256, 1024)))
# tiny-llama: 4 query heads over 2 KV heads, vocabulary 512; "tiny-llama-mha": the same with 4 KV heads
DRY_PLAN = Plan(device="cpu", dtype="bfloat16", warmup=1, repeats=2, point_budget_s=0.02,
                sampler_models=("tiny-llama", "llama-68m"), sampler_batches=(1, 2),
                attention_models=(("gqa", "tiny-llama"), ("mha", "tiny-llama-mha")),
                attention_batches=(1, 2), contexts=(32, 64),
                ragged_batches=(2,), ragged_context=64, attention_kv_limit=1e8,
                decode_models=("tiny-llama", "llama-68m"), decode_batches=(1, 2),
                decode_contexts=(16, 32), decode_kv_limit=1e8,
                kernel_points=(("tiny-llama", 1, 32), ("tiny-llama", 2, 32)), floor_tokens=(1, 4), floor_chain=10,
                ragged_points=(("tiny-llama", 4, 1, 32), ("tiny-llama", 4, 3, 32)),
                sustained_point=("tiny-llama", "llama-68m", 4, 3, 32), sustained_s=1.0, window_s=0.25)


# --------------------------------------------------------------------------- measure: bookkeeping

def now() -> float:
    """The clock every deadline reads (one place, so a test can move it)."""
    return time.monotonic()


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:500]


class Recorder:
    """The JSON document being measured into: written whole after every point, atomically."""

    WRITE_EVERY_S = 2.0  # between writes within a section (each is synced to disk); always at a section's end

    def __init__(self, path: Path, doc: dict[str, Any], deadline: float) -> None:
        self.path, self.doc, self.deadline = path, doc, deadline
        self.section: dict[str, Any] = {}
        self.section_deadline = deadline
        self.written = -math.inf

    def write(self, *, every: bool = False) -> None:
        """Write the document (with ``every``: only if the last write is WRITE_EVERY_S old)."""
        from sim.atomic_write import write_file  # stdlib only: fine on the GPU machine

        if every and now() - self.written < self.WRITE_EVERY_S:
            return
        self.doc["elapsed_s"] = round(now() - self.doc["_start"], 3)
        write_file(self.path, json.dumps({k: v for k, v in self.doc.items() if not k.startswith("_")}, indent=1) + "\n")
        self.written = now()

    def out_of_time(self) -> bool:
        return now() >= self.section_deadline

    def point(self, key: dict[str, Any], run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one point (unless the section's time is spent) and record what it gave, or its error."""
        if self.out_of_time():
            row = {**key, "skipped": f"out of time: the section's share of the {self.doc['budget_s']:g} s budget was spent"}
        else:
            try:
                row = {**key, **run()}
            except Exception as exc:  # noqa: BLE001 - a point's failure is a result; the rest goes on
                row = {**key, "error": error_text(exc)}
            if "error" in row:
                gc.collect()  # what the failed point's frames held (its traceback is gone by now)
        self.section["points"].append(row)
        self.write(every=True)
        return row

    def skip(self, key: dict[str, Any], why: str) -> None:
        self.section["points"].append({**key, "skipped": why})


def timed(fn: Callable[[], object], plan: Plan) -> dict[str, Any]:
    """Seconds per call of ``fn``: CUDA events over graph replays on CUDA, ``perf_counter`` on a CPU."""
    from calibrate.timing import TimerConfig, time_cpu, time_cuda

    cfg = TimerConfig(warmup=plan.warmup, repeats=plan.repeats, budget_s=plan.point_budget_s)
    m = time_cuda(fn, cfg, graph=True) if plan.device == "cuda" else time_cpu(fn, cfg)
    s = m.stats()
    row = {"median_s": s["latency_median_s"], "p10_s": s["latency_p10_s"], "p90_s": s["latency_p90_s"],
           "samples": s["samples"], "graph": m.graph}
    if m.note:
        row["note"] = m.note
    return row


def free(plan: Plan, *, collect: bool = False) -> None:
    """Return what the last points held (their graphs' pools too) to the device; ``collect``: cycles too
    (a collection takes tens of ms, so only between models and sections and after a failure). On the CPU
    (a dry run) there is no device memory to give back, and a collection in a large process (a test
    session's) takes a fifth of a second or more: none is made."""
    if plan.device == "cuda":
        import torch

        if collect:
            gc.collect()
        torch.cuda.empty_cache()


def torch_dtype(plan: Plan):
    from calibrate.model import TORCH_DTYPES

    return TORCH_DTYPES[plan.dtype]


def model_config(name: str):
    """A built-in config; ``<name>-mha``: that model with as many KV heads as query heads."""
    from calibrate.configs import get_config

    if name.endswith("-mha"):
        cfg = get_config(name[:-4])
        return replace(cfg, name=name, num_kv_heads=cfg.num_heads)
    return get_config(name)


# --------------------------------------------------------------------------- section (a): sampler

def apply_top_p(logits, p):
    """vLLM V1's PyTorch top-p (``apply_top_k_top_p`` without top-k, vllm/v1/sample/ops/topk_topp_sampler.py):
    sort every row ascending over the vocabulary, softmax, cumulative sum, mask the tail whose mass
    is at most 1 - p (keeping at least the top token), scatter back."""
    import torch

    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    mask[:, -1] = False
    logits_sort.masked_fill_(mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)


def draw(logits):
    """vLLM V1's random sampling of fp32 logits (the temperature already divided in): a softmax, then the
    exponential race."""
    import torch

    from calibrate.verify import sample

    return sample(torch.softmax(logits, dim=-1))


def sampler_fns(vocab: int, hidden: int, batch: int, plan: Plan, gen) -> dict[str, Callable[[], object]]:
    """One closure per term of :data:`SAMPLER_TERMS`, its inputs allocated up front."""
    import torch
    import torch.nn.functional as F

    from calibrate.verify import sample, verify_logits

    dev, dt = plan.device, torch_dtype(plan)
    h = torch.randn(batch, hidden, generator=gen, device=dev).to(dt)
    weight = (torch.randn(vocab, hidden, generator=gen, device=dev) * 0.02).to(dt)
    logits = torch.randn(batch, vocab, generator=gen, device=dev).to(dt)
    logits32 = logits.float()
    p = torch.full((batch,), TOP_P, device=dev)
    target = torch.randn(batch, K + 1, vocab, generator=gen, device=dev).to(dt)
    draft_probs = torch.softmax(torch.randn(batch, K, vocab, generator=gen, device=dev), dim=-1)
    drafts = sample(draft_probs, gen)
    return {"lm_head": lambda: F.linear(h, weight),
            "cast": lambda: logits.float(),
            "greedy": lambda: logits32.argmax(dim=-1),
            "random": lambda: draw(logits32 / TEMPERATURE),
            "top_p": lambda: draw(apply_top_p(logits32 / TEMPERATURE, p)),
            "rejection_k4": lambda: verify_logits(target, draft_probs, drafts)}  # default generator: graph-safe


def measure_sampler(rec: Recorder, plan: Plan, gen) -> None:
    rec.section["settings"] = {"temperature": TEMPERATURE, "top_p": TOP_P, "k": K, "dtype": plan.dtype,
                               "terms": list(SAMPLER_TERMS)}
    for name in plan.sampler_models:
        cfg = model_config(name)
        for b in plan.sampler_batches:
            key = {"model": name, "vocab": cfg.vocab_size, "hidden": cfg.hidden_size, "batch": b}
            fns: dict[str, Callable[[], object]] = {}
            if not rec.out_of_time():
                try:
                    fns = sampler_fns(cfg.vocab_size, cfg.hidden_size, b, plan, gen)
                except Exception as exc:  # noqa: BLE001 - recorded on each of the point's terms
                    fns = {t: _raiser(exc) for t in SAMPLER_TERMS}
            for term in SAMPLER_TERMS:
                rec.point({**key, "term": term}, lambda: timed(fns[term], plan))
            del fns


def _raiser(exc: BaseException) -> Callable[[], object]:
    def fail() -> object:
        raise exc
    return fail


# --------------------------------------------------------------------------- section (b): attention

def varlen_unavailable(plan: Plan, heads: int, kv_heads: int, head_dim: int) -> str:
    """Why the model's split kernel (calibrate.attention: flash attention, variable length) cannot run here
    ('' where it can): the model's own check, run once on the device against a float32 reference."""
    import torch

    from calibrate.attention import split_attention, split_attention_notes

    if split_attention(torch.device(plan.device), torch_dtype(plan), heads, kv_heads, head_dim):
        return ""
    notes = split_attention_notes()
    return "unavailable: " + next((n for k, n in notes.items() if k.endswith(f"heads {heads}/{kv_heads}x{head_dim}")
                                   and k.startswith(plan.device)), "not checked")


class AttentionPoint:
    """One layer's decode attention over a cache of ``lengths`` keys a row (the new token's included), as
    :func:`calibrate.attention.attend` runs it in the model: on the token-major
    :class:`calibrate.kvcache.KVCache`, with the pass's dense mask (``masked_sdpa``) or its split-kernel
    metadata (``varlen``), each built once as a pass builds it."""

    def __init__(self, cfg, lengths, plan: Plan, gen) -> None:
        import torch

        from calibrate.attention import pass_context
        from calibrate.kvcache import KVCache

        dev, dt = plan.device, torch_dtype(plan)
        self.cfg, self.plan, self.lengths = cfg, plan, lengths
        b, self.max_len = len(lengths), int(max(lengths))
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cache = KVCache(1, b, kv, self.max_len, d, dtype=dt, device=dev)
        self.cache.k.normal_(generator=gen)
        self.cache.v.normal_(generator=gen)
        self.cache.lengths.copy_(torch.as_tensor(lengths, device=dev) - 1)  # the new token goes at length - 1
        self.cache.span = self.max_len - 1
        self.q = torch.randn(b, h, 1, d, generator=gen, device=dev).to(dt)
        self.k_new = torch.randn(b, kv, 1, d, generator=gen, device=dev).to(dt)
        self.v_new = torch.randn(b, kv, 1, d, generator=gen, device=dev).to(dt)
        self.positions = self.cache.lengths[:, None]
        self.dense = pass_context(self.cache, self.positions, h, kv, dt, split=False)
        self.split = pass_context(self.cache, self.positions, h, kv, dt, split=True)

    def masked_sdpa(self):
        from calibrate.attention import attend

        return attend(self.q, self.k_new, self.v_new, self.cache, 0, self.positions, self.dense)

    def sdpa(self):
        import torch.nn.functional as F

        k, v = self.cache.k[0].transpose(1, 2), self.cache.v[0].transpose(1, 2)  # [b, kv heads, keys, d] views
        return F.scaled_dot_product_attention(self.q, k, v, enable_gqa=self.cfg.num_heads != self.cfg.num_kv_heads)

    def varlen(self) -> Callable[[], object]:
        """The split kernel's pass, as the model runs it: each row reads its own keys from the cache."""
        from calibrate.attention import attend

        return lambda: attend(self.q, self.k_new, self.v_new, self.cache, 0, self.positions, self.split)

    def varlen_error(self, call: Callable[[], object]) -> float:
        """Largest |varlen - masked SDPA| over the outputs: the varlen call reads what the model's attention reads."""
        ref = self.masked_sdpa().float()
        return float((call().float() - ref).abs().max())


def kv_bytes(tokens: int, cfg, plan: Plan) -> int:
    from calibrate.configs import dtype_bytes

    return 2 * tokens * cfg.num_kv_heads * cfg.head_dim * dtype_bytes(plan.dtype)


def attention_row(seconds: dict[str, Any], read: int, useful: int) -> dict[str, Any]:
    """The time with the KV bytes the kernel reads and those the rows hold (they differ for ragged rows
    under the masked SDPA, which reads the longest row for each), and both as rates."""
    return {**seconds, "kv_bytes": read, "kv_read_tb_s": read / seconds["median_s"] / 1e12,
            "useful_bytes": useful, "useful_tb_s": useful / seconds["median_s"] / 1e12}


def measure_attention(rec: Recorder, plan: Plan, gen) -> None:
    import numpy as np

    layouts = [(label, model_config(name)) for label, name in plan.attention_models]
    base_kv = layouts[0][1].num_kv_heads
    rec.section["settings"] = {"dtype": plan.dtype, "layouts": {
        label: {"model": cfg.name, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim}
        for label, cfg in layouts}, "variants": list(ATTENTION_VARIANTS),
        "context": "keys read per row, the new token's included; a layout's context is the first's x its KV "
                   "heads ratio, so every layout reads the same KV bytes at a grid point"}
    for label, cfg in layouts:
        for b in plan.attention_batches:
            for c0 in plan.contexts:
                c = c0 * base_kv // cfg.num_kv_heads
                key = {"layout": label, "model": cfg.name, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads,
                       "head_dim": cfg.head_dim, "batch": b, "context": c}
                one_point(rec, plan, gen, cfg, key, [c] * b)
    rng = np.random.default_rng(0)
    label, cfg = layouts[0]
    for b in plan.ragged_batches:
        lengths = [int(x) for x in rng.integers(1, plan.ragged_context + 1, size=b)]
        key = {"layout": f"{label}-ragged", "model": cfg.name, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads,
               "head_dim": cfg.head_dim, "batch": b, "context": plan.ragged_context, "longest": max(lengths),
               "mean_length": sum(lengths) / b}
        one_point(rec, plan, gen, cfg, key, lengths, variants=("masked_sdpa", "varlen"))


def one_point(rec: Recorder, plan: Plan, gen, cfg, key: dict[str, Any], lengths: list[int],
              variants: tuple[str, ...] = ATTENTION_VARIANTS) -> None:
    """Every variant at one (layout, batch, lengths): the masked SDPA reads the longest row for each row."""
    read_all = kv_bytes(max(lengths) * len(lengths), cfg, plan)
    useful = kv_bytes(sum(lengths), cfg, plan)
    if read_all > plan.attention_kv_limit:  # one token-major cache serves every variant
        for v in variants:
            rec.skip({**key, "variant": v}, f"KV {read_all / 1e9:.1f} GB over the "
                                             f"{plan.attention_kv_limit / 1e9:g} GB limit")
        return
    point: AttentionPoint | None = None
    try:
        if not rec.out_of_time():
            point = AttentionPoint(cfg, lengths, plan, gen)
    except Exception as exc:  # noqa: BLE001 - recorded on each variant
        failed = exc
        for v in variants:
            rec.point({**key, "variant": v}, _raiser(failed))
        return
    if "masked_sdpa" in variants:
        rec.point({**key, "variant": "masked_sdpa"},
                  lambda: attention_row(timed(point.masked_sdpa, plan), read_all, useful))
    if "sdpa" in variants:
        rec.point({**key, "variant": "sdpa"}, lambda: attention_row(timed(point.sdpa, plan), read_all, useful))
    if "varlen" in variants:
        def varlen() -> dict[str, Any]:
            why = varlen_unavailable(plan, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
            if why:
                return {"unavailable": why}
            call = point.varlen()
            check = point.varlen_error(call)
            return {**attention_row(timed(call, plan), useful, useful), "max_abs_diff_vs_masked": check}
        rec.point({**key, "variant": "varlen"}, lambda: _unavailable_on_error(varlen))
    del point
    free(plan)


def _unavailable_on_error(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The varlen kernel may be missing from a torch build or refuse these shapes: 'unavailable', with why."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001
        return {"unavailable": f"unavailable: {error_text(exc)}"}


# --------------------------------------------------------------------------- section (c): decode step

def model_for(rec: Recorder, plan: Plan, cfg, keys: list[dict[str, Any]]):
    """``cfg``'s model on the device for the points ``keys``, or None with every point recorded: skipped
    when the section's time is spent, failed (with why) when the model cannot be built."""
    from calibrate.model import Transformer

    if rec.out_of_time():
        for key in keys:
            rec.point(key, dict)
        return None
    print(f"  {cfg.name}", flush=True)
    try:
        return Transformer(cfg, device=plan.device, dtype=torch_dtype(plan))
    except Exception as exc:  # noqa: BLE001 - recorded on each of the model's points
        for key in keys:
            rec.point(key, _raiser(exc))
        free(plan, collect=True)
        return None


def measure_decode(rec: Recorder, plan: Plan, gen) -> None:
    """Each model's decode step: calibration's timed target pass (one token a sequence over ``context``
    cached ones, rolled back after) plus vLLM's greedy sampler on the last logits (cast to fp32, argmax)."""
    from calibrate.configs import kv_bytes_per_token
    from calibrate.grid import Point
    from calibrate.passes import build_pass

    rec.section["settings"] = {"dtype": plan.dtype, "timed": "calibrate.passes.build_pass decode/target, q = 1, "
                               "then the last position's logits cast to fp32 and argmax"}
    for name in plan.decode_models:
        cfg = model_config(name)
        keys = [{"model": name, "batch": b, "context": c, "kv_bytes": kv_bytes_per_token(cfg, plan.dtype) * b * (c + 1)}
                for b in plan.decode_batches for c in plan.decode_contexts]
        model = model_for(rec, plan, cfg, keys)
        if model is None:
            continue
        for key in keys:
            if key["kv_bytes"] > plan.decode_kv_limit:
                rec.skip(key, f"KV cache {key['kv_bytes'] / 1e9:.1f} GB over the {plan.decode_kv_limit / 1e9:g} GB limit")
                continue

            def step(key=key) -> dict[str, Any]:
                timed_pass = build_pass(Point("decode", "target", key["batch"], 1, key["context"]), {"target": model}, gen)
                return timed(lambda: timed_pass.fn()[:, -1].float().argmax(dim=-1), plan)
            rec.point(key, step)
            free(plan)
        del model
        free(plan, collect=True)


# --------------------------------------------------------------------------- section (d): kernels

def kernel_class(name: str) -> str:
    """What a kernel (CUDA) or an operator (a CPU dry run) is, by its name: matrix products (cuBLAS's
    and CUTLASS's kernels, and their split-K reductions), attention (flash and fused attention), or a small op
    (elementwise, norms, rotary, copies, the cache write, reductions: everything else)."""
    low = name.lower()
    if any(t in low for t in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if any(t in low for t in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "splitk", "aten::linear", "aten::mm",
                              "aten::addmm", "aten::bmm", "matmul")):
        return "gemm"
    return "small"


def profiled_kernels(fn: Callable[[], object], plan: Plan, runs: int) -> list[tuple[str, float]]:
    """(name, seconds) of every kernel one call of ``fn`` ran, from torch's profiler over ``runs`` eager calls
    (kernels' own GPU spans; on a CPU, the spans of the operators Python called)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = plan.device == "cuda"
    for _ in range(2):
        fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    if cuda:
        picked = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        picked = [e for e in events if e.name.startswith("aten::")  # the operators Python called
                  and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return [(e.name, e.time_range.elapsed_us() / 1e6 / runs) for e in picked]


def kernel_row(kernels: list[tuple[str, float]], runs: int) -> dict[str, Any]:
    """Seconds and counts by class, per pass, and the small ops' heaviest kernels (name cut to 90)."""
    row: dict[str, Any] = {}
    for cls in KERNEL_CLASSES:
        mine = [t for n, t in kernels if kernel_class(n) == cls]
        row[f"{cls}_s"], row[f"{cls}_kernels"] = sum(mine), len(mine) / runs
    row["kernels_s"] = sum(t for _, t in kernels)
    row["kernels"] = len(kernels) / runs
    small: dict[str, list[float]] = {}
    for n, t in kernels:
        if kernel_class(n) == "small":
            small.setdefault(n[:90], []).append(t)
    row["small_top"] = [{"name": n, "per_pass": len(ts) / runs, "s": sum(ts)}
                        for n, ts in sorted(small.items(), key=lambda kv: -sum(kv[1]))[:10]]
    return row


def measure_kernels(rec: Recorder, plan: Plan, gen) -> None:
    """The decode pass of :func:`measure_decode` (without the sampler), profiled eagerly, and its graph time."""
    from calibrate.grid import Point
    from calibrate.passes import build_pass

    runs = 3
    rec.section["settings"] = {"dtype": plan.dtype, "runs": runs, "classes": list(KERNEL_CLASSES),
                               "timed": "calibrate.passes.build_pass decode/target, q = 1: kernels from torch's "
                                        "profiler over eager calls; graph_s from CUDA-graph replays"}
    for name in dict.fromkeys(m for m, _, _ in plan.kernel_points):
        keys = [{"model": m, "batch": b, "context": c} for m, b, c in plan.kernel_points if m == name]
        model = model_for(rec, plan, model_config(name), keys)
        if model is None:
            continue
        for key in keys:
            def point(key=key) -> dict[str, Any]:
                timed_pass = build_pass(Point("decode", "target", key["batch"], 1, key["context"]), {"target": model}, gen)
                row = kernel_row(profiled_kernels(timed_pass.fn, plan, runs), runs)
                graph = timed(timed_pass.fn, plan)
                return {**row, "graph_s": graph["median_s"], "gaps_s": graph["median_s"] - row["kernels_s"],
                        "graph": graph["graph"]}
            rec.point(key, point)
            free(plan)
        del model
        free(plan, collect=True)


# --------------------------------------------------------------------------- section (e): a small kernel's floor

def floor_fns(tokens: int, hidden: int, plan: Plan, gen) -> dict[str, Callable[[], object]]:
    """One closure per :data:`FLOOR_OPS`, each running its op ``plan.floor_chain`` times back to back on
    ``tokens`` x ``hidden`` activations (an engine's small ops: a residual add, an RMSNorm, SiLU and multiply,
    the last two kernels in torch)."""
    import torch
    import torch.nn.functional as F

    dev, dt = plan.device, torch_dtype(plan)
    x = torch.randn(tokens, hidden, generator=gen, device=dev).to(dt)
    y = torch.randn(tokens, hidden, generator=gen, device=dev).to(dt)
    w = torch.ones(hidden, device=dev, dtype=dt)
    gate_up = torch.randn(tokens, 2 * hidden, generator=gen, device=dev).to(dt)
    n = plan.floor_chain

    def add():
        for _ in range(n):
            x.add_(y)

    def norm():
        for _ in range(n):
            F.rms_norm(x, (hidden,), w, 1e-5)

    def silu_mul():
        for _ in range(n):
            g, u = gate_up.chunk(2, dim=-1)
            F.silu(g) * u
    return {"add": add, "rms_norm": norm, "silu_mul": silu_mul}


def measure_floor(rec: Recorder, plan: Plan, gen) -> None:
    hidden = 4096 if plan.device == "cuda" else 64
    kernels = {"add": 1, "rms_norm": 1, "silu_mul": 2}
    rec.section["settings"] = {"dtype": plan.dtype, "hidden": hidden, "chain": plan.floor_chain,
                               "kernels_per_op": kernels, "per_kernel_s": "the graph's time / (chain x kernels)"}
    for tokens in plan.floor_tokens:
        fns = floor_fns(tokens, hidden, plan, gen) if not rec.out_of_time() else {}
        for op in FLOOR_OPS:
            def point(op=op) -> dict[str, Any]:
                row = timed(fns[op], plan)
                bytes_per_kernel = {"add": 3, "rms_norm": 2, "silu_mul": 3}[op] * tokens * hidden * 2 / kernels[op]
                return {**row, "per_kernel_s": row["median_s"] / plan.floor_chain / kernels[op],
                        "bytes_per_kernel": bytes_per_kernel}
            rec.point({"op": op, "tokens": tokens, "hidden": hidden}, point)
        del fns
        free(plan)


# --------------------------------------------------------------------------- section (f): ragged rows

def ragged_pass(model, rows: int, q: int, lengths: list[int], gen) -> Callable[[], object]:
    """One pass of ``q`` tokens a row over a cache whose rows hold ``lengths`` tokens, rolled back after."""
    import torch

    tokens = torch.randint(0, model.cfg.vocab_size, (rows, q), generator=gen, device=model.device)
    cache = model.new_cache(rows, max(lengths) + q)
    cache.fill_lengths(lengths)

    def one_pass():
        out = model(tokens, cache)
        cache.rollback(q)
        return out
    return one_pass


def measure_ragged(rec: Recorder, plan: Plan, gen) -> None:
    from calibrate.kvcache import ragged_lengths  # calibration's --ragged-contexts spreads rows the same way

    rec.section["settings"] = {"dtype": plan.dtype, "lengths": "ragged_lengths: pairs around the mean, from about "
                               "a quarter of it to 1.75 times it; uniform: every row at the mean",
                               "timed": "the model's pass over q tokens a row, rolled back after (calibration's)"}
    for name in dict.fromkeys(m for m, _, _, _ in plan.ragged_points):
        mine = [(b, q, c) for m, b, q, c in plan.ragged_points if m == name]
        keys = [{"model": name, "batch": b, "query_tokens": q, "context": c, "lengths": lengths}
                for b, q, c in mine for lengths in ("uniform", "ragged")]
        model = model_for(rec, plan, model_config(name), keys)
        if model is None:
            continue
        for key in keys:
            b, q, c = key["batch"], key["query_tokens"], key["context"]
            lengths = [c] * b if key["lengths"] == "uniform" else ragged_lengths(b, c)
            rec.point({**key, "longest": max(lengths)},
                      lambda lengths=lengths, b=b, q=q: timed(ragged_pass(model, b, q, lengths, gen), plan))
            free(plan)
        del model
        free(plan, collect=True)


# --------------------------------------------------------------------------- section (g): sustained

def replayable(fn: Callable[[], object], plan: Plan) -> Callable[[], object]:
    """``fn``'s CUDA graph, replayed (calibration's capture, :func:`calibrate.timing._capture`); ``fn`` on a CPU."""
    if plan.device != "cuda":
        return fn
    from calibrate.timing import _capture

    return _capture(fn, plan.warmup)


class Marks:
    """Points in the device's queue: CUDA events on CUDA (read after a wait), ``perf_counter`` on a CPU."""

    def __init__(self, plan: Plan) -> None:
        self.cuda = plan.device == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wait(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def seconds(self, begin, end) -> float:
        return begin.elapsed_time(end) / 1e3 if self.cuda else end - begin


GPU_STATE = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")


def gpu_state() -> dict[str, Any]:
    """The GPU's SM and memory clocks (MHz), power (W), temperature (C) and throttle reasons, from nvidia-smi
    ({} where there is none: a CPU dry run)."""
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_STATE)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return {}
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
    names = ("sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle")
    state: dict[str, Any] = {}
    for name, value in zip(names, values):
        try:
            state[name] = value if name == "throttle" else float(value)
        except ValueError:
            state[name] = value
    return state


def calibration_style(replay: Callable[[], object], plan: Plan) -> list[float]:
    """Seconds of each replay with the device idle before it, as calibration times a point."""
    marks, out = Marks(plan), []
    for _ in range(plan.warmup + plan.repeats):
        marks.wait()
        begin = marks.mark()
        replay()
        end = marks.mark()
        marks.wait()
        out.append(marks.seconds(begin, end))
    return out[plan.warmup:]


def back_to_back(replay: Callable[[], object], plan: Plan, count: int) -> list[float]:
    """Seconds of each of ``count`` replays queued one after another, with one wait at the end."""
    marks = Marks(plan)
    marks.wait()
    points = [marks.mark()]
    for _ in range(count):
        replay()
        points.append(marks.mark())
    marks.wait()
    return [marks.seconds(a, b) for a, b in zip(points, points[1:])]


def served_steps(draft: Callable[[], object], target: Callable[[], object], drafts: int, plan: Plan,
                 seconds: float) -> list[dict[str, Any]]:
    """Steps as the GPU replay runs them (``drafts`` draft passes, then the target's, one wait a step) for
    ``seconds``, summed up per ``plan.window_s``: the target pass's and the step's median, the GPU's state."""
    import numpy as np

    marks, windows = Marks(plan), []
    start = now()
    while now() - start < seconds:
        window_start, targets, steps = now(), [], []
        while now() - window_start < plan.window_s and now() - start < seconds:
            begin = marks.mark()
            for _ in range(drafts):
                draft()
            middle = marks.mark()
            target()
            end = marks.mark()
            marks.wait()
            targets.append(marks.seconds(middle, end))
            steps.append(marks.seconds(begin, end))
        windows.append({"t_s": round(now() - start, 3), "steps": len(steps),
                        "target_median_s": float(np.median(targets)), "step_median_s": float(np.median(steps)),
                        **gpu_state()})
    return windows


def measure_sustained(rec: Recorder, plan: Plan, gen) -> None:
    import numpy as np

    from calibrate.grid import Point
    from calibrate.passes import build_pass

    target_name, draft_name, rows, q, context = plan.sustained_point
    rec.section["settings"] = {"dtype": plan.dtype, "target": target_name, "draft": draft_name, "rows": rows,
                               "query_tokens": q, "context": context, "window_s": plan.window_s,
                               "timed": "calibrate.passes.build_pass decode/target and decode/draft, from their "
                                        "CUDA graphs", "gpu_state": "nvidia-smi --query-gpu=" + ",".join(GPU_STATE)}
    keys = [{"mode": mode} for mode in ("calibration", "back_to_back", "steps")]
    target = model_for(rec, plan, model_config(target_name), keys)
    draft = model_for(rec, plan, model_config(draft_name), keys) if target is not None else None
    if target is None or draft is None:
        return
    t_pass = build_pass(Point("decode", "target", rows, q, context), {"target": target}, gen)
    d_pass = build_pass(Point("decode", "draft", rows, 1, context), {"draft": draft}, gen)
    t_replay, d_replay = replayable(t_pass.fn, plan), replayable(d_pass.fn, plan)

    def summed(samples: list[float]) -> dict[str, Any]:
        return {"median_s": float(np.median(samples)), "p10_s": float(np.percentile(samples, 10)),
                "p90_s": float(np.percentile(samples, 90)), "samples": len(samples), **gpu_state()}

    rec.point(keys[0], lambda: summed(calibration_style(t_replay, plan)))
    rec.point(keys[1], lambda: summed(back_to_back(t_replay, plan, 10 * plan.repeats)))
    left = rec.section_deadline - now() - 2 * plan.window_s  # room for the last window and the write
    rec.point(keys[2], lambda: {"windows": served_steps(d_replay, t_replay, q - 1, plan,
                                                         max(min(plan.sustained_s, left), plan.window_s))})
    # the models and graphs go with this frame; measure() then frees the device's cache


# --------------------------------------------------------------------------- measure: the run

MEASURES = {"sampler": measure_sampler, "attention": measure_attention, "decode_step": measure_decode,
            "kernels": measure_kernels, "floor": measure_floor, "ragged": measure_ragged,
            "sustained": measure_sustained}


def measure(out: Path, budget: float, dry_run: bool, sections: tuple[str, ...] = SECTIONS) -> dict[str, Any]:
    """The ``sections`` in order, each under its share of ``budget``; the document as written."""
    start = now()
    import torch

    from calibrate.environment import device_info, versions

    plan = DRY_PLAN if dry_run or not torch.cuda.is_available() else GPU_PLAN
    why_dry = "" if not plan.dry_run else "--dry-run" if dry_run else "no CUDA device"
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "_start": start, "kind": "gpu_step_terms", "schema": 1, "dry_run": plan.dry_run, "dry_run_why": why_dry,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "budget_s": budget,
        "device": device_info(plan.device), "versions": versions(),
        "timer": {"method": "CUDA events over CUDA-graph replays" if plan.device == "cuda" else "perf_counter",
                  "warmup": plan.warmup, "repeats": plan.repeats, "point_budget_s": plan.point_budget_s},
        "sections": {}}
    rec = Recorder(out / RESULT, doc, start + budget)
    gen = torch.Generator(device=plan.device).manual_seed(0)
    for i, name in enumerate(sections):
        left = rec.deadline - now()
        share = SHARES[name] / sum(SHARES[s] for s in sections[i:])
        rec.section_deadline = now() + max(left, 0.0) * share
        rec.section = doc["sections"][name] = {"status": "running", "points": []}
        t0 = now()
        print(f"[{t0 - start:6.1f} s] {name}: until {rec.section_deadline - start:.0f} s", flush=True)  # where a hang is
        try:
            MEASURES[name](rec, plan, gen)
            short = [p for p in rec.section["points"] if "error" in p or str(p.get("skipped", "")).startswith("out of time")]
            rec.section["status"] = "partial" if short else "done"
        except Exception as exc:  # noqa: BLE001 - a section's failure is recorded and the next one runs
            rec.section.update(status="failed", error=error_text(exc))
        except KeyboardInterrupt:  # SIGINT, or SIGTERM (main): keep what finished, say where it stopped
            rec.section.update(status="interrupted")
            doc["interrupted"] = True
        rec.section["elapsed_s"] = round(now() - t0, 3)
        rec.write()
        if doc.get("interrupted"):
            break
        free(plan, collect=True)
    print(summary(doc))
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def summary(doc: dict[str, Any]) -> str:
    """A short human table of what was measured: median ms per term or variant (KV TB/s beside attention's),
    one line per (model or layout, batch, context); '-' where a point has no time."""
    lines = [f"{doc['device'].get('name')} ({'dry run, ' + doc['dry_run_why'] if doc['dry_run'] else 'GPU'}), "
             f"torch {doc['versions'].get('torch')}, CUDA {doc['versions'].get('cuda')}, {doc['elapsed_s']:.1f} s"]
    for name, sec in doc["sections"].items():
        pts = sec["points"]
        counts = {k: sum(k in p for p in pts) for k in ("median_s", "skipped", "error", "unavailable")}
        counts["median_s"] += sum("graph_s" in p for p in pts)
        lines.append(f"{name}: {sec['status']}, {counts['median_s']} timed, {counts['skipped']} skipped, "
                     f"{counts['error']} failed, {counts['unavailable']} unavailable, {sec.get('elapsed_s', 0):.1f} s"
                     + (f" ({sec['error']})" if "error" in sec else ""))
        column = {"sampler": "term", "attention": "variant", "floor": "op", "ragged": "lengths",
                  "sustained": "mode"}.get(name)
        rows: dict[tuple, dict[str, str]] = {}
        for p in pts:
            row = tuple(p.get(k) for k in ("model", "layout", "batch", "query_tokens", "context", "tokens") if k in p)
            if name == "kernels":
                cell = "-" if "graph_s" not in p else " ".join(
                    f"{c} {1e3 * p[c + '_s']:.3f} ({p[c + '_kernels']:g})" for c in KERNEL_CLASSES) + (
                    f", graph {1e3 * p['graph_s']:.3f}, gaps {1e3 * p['gaps_s']:.3f}")
            elif name == "floor":
                cell = "-" if "per_kernel_s" not in p else f"{1e6 * p['per_kernel_s']:.2f} us/kernel"
            elif "windows" in p:
                w = p["windows"]
                cell = f"{len(w)} windows, target {1e3 * w[0]['target_median_s']:.3f} -> " \
                       f"{1e3 * w[-1]['target_median_s']:.3f} ms" if w else "no window"
            else:
                cell = "-" if "median_s" not in p else f"{1e3 * p['median_s']:.3f}" + (
                    f" ({p['kv_read_tb_s']:.2f} TB/s)" if "kv_read_tb_s" in p else "")
            rows.setdefault(row, {})[p.get(column, "ms") if column else "ms"] = cell
        for row, cells in rows.items():
            lines.append("  " + " ".join(str(v) for v in row) + ": " + ", ".join(f"{k} {v}" for k, v in cells.items()))
    return "\n".join(lines)


# --------------------------------------------------------------------------- compare (here, with the whole project)

NOT_COMPOSED = "not composed"


class Composer:
    """The composition's prices for measured points: one pricer per model, as ``specbatch compose --gpu``
    builds it on one GPU (benchmarks/step_terms.py's :func:`pricer`); a model it cannot price is None."""

    def __init__(self, gpu: str) -> None:
        self.gpu = gpu
        self.pricers: dict[str, Any] = {}

    def pricer(self, model: str):
        if model not in self.pricers:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from step_terms import pricer

            from sim.errors import InputError

            try:
                self.pricers[model] = pricer(model, self.gpu, 1)[0]
            except InputError as exc:
                if exc.field == "gpu":
                    raise
                self.pricers[model] = None
        return self.pricers[model]

    def decode_step(self, model: str, batch: int, context: int) -> float:
        """One token a sequence over ``context`` cached ones: the pass with its LM head, and the greedy sampler."""
        p = self.pricer(model)
        if p is None:
            return math.nan
        return float(sum(p.decode_parts(batch, 1, context).values()) + p.verify(batch, 0, "greedy"))

    def sampler(self, model: str, batch: int) -> dict[str, float]:
        """The LM head and the sampler over the model's vocabulary, by the measured terms' names."""
        p = self.pricer(model)
        if p is None:
            return {}
        return {"lm_head": float(p.lm_head(batch)), "greedy": float(p.verify(batch, 0, "greedy")),
                "random": float(p.verify(batch, 0, "random")), "top_p": float(p.verify(batch, 0, "top-p")),
                "rejection_k4": float(p.verify(batch, K, "random"))}

    def attention(self, model: str, batch: int, kv_length: float) -> float:
        """One layer's decode attention, one query token a sequence over ``kv_length`` keys (the new one's
        included): the pass's attention term divided by its layers."""
        p = self.pricer(model)
        if p is None:
            return math.nan
        return float(p.decode_parts(batch, 1, kv_length - 1)["attention"]) / p.model.num_layers


# measured sampler terms and what they are compared with: vLLM's sampler starts from the bf16 logits,
# so the cast is part of every mode (sim.compose.sampler prices it in each)
SAMPLER_ROWS = (("lm_head", ("lm_head",), "lm_head"), ("greedy", ("cast", "greedy"), "greedy"),
                ("random", ("cast", "random"), "random"), ("top_p", ("cast", "top_p"), "top_p"),
                ("rejection k=4", ("rejection_k4",), "rejection_k4"))


def ms(seconds: float) -> str:
    """A 13-wide cell of milliseconds, or 'not composed' where the composition has no price."""
    return f"{1e3 * seconds:13.3f}" if math.isfinite(seconds) else f"{NOT_COMPOSED:>13}"


def ratio(measured: float, composed: float) -> str:
    return f"{measured / composed:8.2f}" if math.isfinite(composed) and composed > 0 else f"{'':>8}"


def error(measured: float, composed: float) -> str:
    return f"{100 * (measured / composed - 1):+9.1f}%" if math.isfinite(composed) and composed > 0 else ""


def why_missing(point: dict[str, Any]) -> str:
    for key in ("skipped", "error", "unavailable"):
        if key in point:
            text = str(point[key])
            return text if text.startswith(key) else f"{key}: {text}"
    return "no time"


def decode_table(doc: dict[str, Any], composer: Composer) -> list[str]:
    points = doc["sections"].get("decode_step", {}).get("points", [])
    lines = []
    for model in dict.fromkeys(p["model"] for p in points):
        lines += ["", f"decode step, {model}: one token a sequence, LM head and greedy sampler included",
                  f"{'batch':>6}{'context':>9}{'measured ms':>13}{'composed ms':>13}{'error':>11}"]
        for p in (p for p in points if p["model"] == model):
            head = f"{p['batch']:>6}{p['context']:>9}"
            if "median_s" not in p:
                lines.append(f"{head}  {why_missing(p)}")
                continue
            composed = composer.decode_step(model, p["batch"], p["context"])
            lines.append(f"{head}{ms(p['median_s'])}{ms(composed)}{error(p['median_s'], composed)}".rstrip())
    return lines


def sampler_table(doc: dict[str, Any], composer: Composer) -> list[str]:
    points = doc["sections"].get("sampler", {}).get("points", [])
    lines = []
    for model in dict.fromkeys(p["model"] for p in points):
        mine = [p for p in points if p["model"] == model]
        lines += ["", f"LM head and sampler, vocabulary {mine[0]['vocab']} (hidden {mine[0]['hidden']}, {model}'s)",
                  f"{'term':<15}{'batch':>6}{'measured ms':>13}{'composed ms':>13}{'ratio':>8}"]
        for label, parts, priced in SAMPLER_ROWS:
            for b in dict.fromkeys(p["batch"] for p in mine):
                got = {p["term"]: p for p in mine if p["batch"] == b}
                head = f"{label:<15}{b:>6}"
                missing = [got.get(t, {}) for t in parts if "median_s" not in got.get(t, {})]
                if missing:
                    lines.append(f"{head}  {why_missing(missing[0])}")
                    continue
                measured = sum(got[t]["median_s"] for t in parts)
                composed = composer.sampler(model, b).get(priced, math.nan)
                lines.append(f"{head}{ms(measured)}{ms(composed)}{ratio(measured, composed)}".rstrip())
    return lines


def attention_table(doc: dict[str, Any], composer: Composer) -> list[str]:
    points = doc["sections"].get("attention", {}).get("points", [])
    lines = []
    for layout in dict.fromkeys(p["layout"] for p in points):
        mine = [p for p in points if p["layout"] == layout]
        first = mine[0]
        ragged = layout.endswith("-ragged")
        lines += ["", f"decode attention, one layer, {layout}: {first['heads']} query heads, {first['kv_heads']} KV "
                      f"heads of {first['head_dim']}, composed as {first['model']}"
                  + ("; rows' lengths uniform in [1, context], composed at their mean, rates of the bytes the rows "
                     "hold" if ragged else ""),
                  f"{'batch':>6}{'context':>9}  {'variant':<12}{'measured ms':>13}{'TB/s':>8}{'composed ms':>13}"
                  f"{'TB/s':>8}{'ratio':>8}"]
        for p in mine:
            head = f"{p['batch']:>6}{p['context']:>9}  {p['variant']:<12}"
            if "median_s" not in p:
                lines.append(f"{head}  {why_missing(p)}")
                continue
            kv_length = p["mean_length"] if ragged else p["context"]
            composed = composer.attention(p["model"], p["batch"], kv_length)
            useful = p.get("useful_bytes", p["kv_bytes"])
            rate = useful / composed / 1e12 if math.isfinite(composed) and composed > 0 else math.nan
            measured_rate = useful / p["median_s"] / 1e12
            lines.append((f"{head}{ms(p['median_s'])}{measured_rate:8.3f}{ms(composed)}"
                          + (f"{rate:8.3f}" if math.isfinite(rate) else f"{'':>8}") + ratio(p["median_s"], composed)).rstrip())
    return lines


def clean_pass_s(doc: dict[str, Any], model: str, batch: int, context: int) -> float:
    """The decode pass alone from the ``decode_step`` section (timed with no profiler attached): the step less
    the measured cast and greedy argmax at that batch; NaN where either was not measured."""
    step = next((p for p in doc["sections"].get("decode_step", {}).get("points", [])
                 if (p["model"], p["batch"], p["context"]) == (model, batch, context) and "median_s" in p), None)
    terms = {p["term"]: p["median_s"] for p in doc["sections"].get("sampler", {}).get("points", [])
             if (p["model"], p["batch"]) == (model, batch) and "median_s" in p}
    if step is None or not {"cast", "greedy"} <= terms.keys():
        return math.nan
    return step["median_s"] - terms["cast"] - terms["greedy"]


def kernels_table(doc: dict[str, Any], composer: Composer) -> list[str]:
    """The decode pass by kind of kernel against the composition's parts (its GEMMs with the LM head, attention,
    small ops), and what runs in no kernel: the pass's clean graph time less its kernels' time."""
    points = doc["sections"].get("kernels", {}).get("points", [])
    lines = []
    for model in dict.fromkeys(p["model"] for p in points):
        pricer = composer.pricer(model)
        lines += ["", f"decode pass taken apart, {model}: measured ms (kernels a pass) / composed ms",
                  f"{'batch':>6}{'context':>9}" + "".join(f"{label:>22}" for label in KERNEL_LABELS.values())
                  + f"{'no kernel':>11}{'whole pass':>18}"]
        for p in (p for p in points if p["model"] == model):
            head = f"{p['batch']:>6}{p['context']:>9}"
            if "kernels_s" not in p:
                lines.append(f"{head}  {why_missing(p)}")
                continue
            parts = composed_parts(pricer, p["batch"], p["context"])
            cells = ""
            for cls in KERNEL_CLASSES:
                priced = f"{1e3 * parts[cls]:.3f}" if math.isfinite(parts[cls]) else "-"
                cell = f"{1e3 * p[f'{cls}_s']:.3f} ({p[f'{cls}_kernels']:g}) / {priced}"
                cells += f"{cell:>22}"
            clean = clean_pass_s(doc, model, p["batch"], p["context"])
            gaps = f"{1e3 * (clean - p['kernels_s']):11.3f}" if math.isfinite(clean) else f"{'':>11}"
            composed = sum(parts.values())
            whole = "" if not math.isfinite(clean) else f"{1e3 * clean:.3f} / " + (
                f"{1e3 * composed:.3f}" if math.isfinite(composed) else "-")
            lines.append(f"{head}{cells}{gaps}{whole:>18}".rstrip())
    return lines


KERNEL_LABELS = {"gemm": "matrix products", "attention": "attention", "small": "small ops"}


def composed_parts(pricer, batch: int, context: int) -> dict[str, float]:
    """The composition's decode pass in :data:`KERNEL_CLASSES` (its LM head is a matrix product); NaN unpriced."""
    if pricer is None:
        return dict.fromkeys(KERNEL_CLASSES, math.nan)
    parts = {k: float(v) for k, v in pricer.decode_parts(batch, 1, context).items()}
    return {"gemm": parts["gemm"] + parts["lm_head"], "attention": parts["attention"], "small": parts["small_ops"]}


def floor_table(doc: dict[str, Any]) -> list[str]:
    """A small kernel's time inside a graph: per op and token count, with the rate its bytes alone would give."""
    sec = doc["sections"].get("floor", {})
    points = sec.get("points", [])
    if not points:
        return []
    settings = sec.get("settings", {})
    lines = ["", f"a small kernel's time in a CUDA graph ({settings.get('chain')} back to back, hidden "
                 f"{settings.get('hidden')}): us per kernel (its bytes / that time, TB/s)",
             f"{'tokens':>7}" + "".join(f"{op:>20}" for op in FLOOR_OPS)]
    for tokens in dict.fromkeys(p["tokens"] for p in points):
        cells = ""
        for op in FLOOR_OPS:
            p = next((q for q in points if q["tokens"] == tokens and q["op"] == op), {})
            cell = "-"
            if "per_kernel_s" in p:
                cell = f"{1e6 * p['per_kernel_s']:.2f} ({p['bytes_per_kernel'] / p['per_kernel_s'] / 1e12:.2f})"
            cells += f"{cell:>20}"
        lines.append(f"{tokens:>7}{cells}")
    return lines


def ragged_table(doc: dict[str, Any]) -> list[str]:
    """Each pass over rows of different contexts against the same pass with every row at their mean."""
    points = doc["sections"].get("ragged", {}).get("points", [])
    lines = []
    for model in dict.fromkeys(p["model"] for p in points):
        mine = [p for p in points if p["model"] == model]
        lines += ["", f"a {model} pass over rows of different contexts (ragged) against every row at their mean "
                      f"(uniform), ms",
                  f"{'rows':>5}{'q':>4}{'mean ctx':>10}{'longest':>9}{'uniform':>10}{'ragged':>10}{'ratio':>8}"]
        for b, q, c in dict.fromkeys((p["batch"], p["query_tokens"], p["context"]) for p in mine):
            got = {p["lengths"]: p for p in mine if (p["batch"], p["query_tokens"], p["context"]) == (b, q, c)}
            head = f"{b:>5}{q:>4}{c:>10}{got.get('ragged', {}).get('longest', ''):>9}"
            missing = [got.get(v, {}) for v in ("uniform", "ragged") if "median_s" not in got.get(v, {})]
            if missing:
                lines.append(f"{head}  {why_missing(missing[0])}")
                continue
            u, r = got["uniform"]["median_s"], got["ragged"]["median_s"]
            lines.append(f"{head}{1e3 * u:10.3f}{1e3 * r:10.3f}{r / u:8.3f}")
    return lines


def sustained_table(doc: dict[str, Any]) -> list[str]:
    """The target pass timed as calibration does, back to back, and window by window of served steps."""
    section = doc["sections"].get("sustained")
    if not section:
        return []
    got = {p["mode"]: p for p in section["points"]}
    st = section.get("settings", {})
    base = got.get("calibration", {}).get("median_s")
    lines = ["", f"the {st.get('target')} pass of {st.get('rows')} rows x {st.get('query_tokens')} tokens at context "
                 f"{st.get('context')}, ms: as calibration times it, back to back, and in steps served for a while "
                 f"({st.get('query_tokens', 1) - 1} {st.get('draft')} passes, then it; one wait a step)"]
    for mode in ("calibration", "back_to_back"):
        p = got.get(mode, {})
        if "median_s" in p:
            ratio = f"{p['median_s'] / base:8.3f}" if base else ""
            lines.append(f"{mode:>14}{1e3 * p['median_s']:10.3f}{ratio}  " + _state_text(p))
        else:
            lines.append(f"{mode:>14}  {why_missing(p)}")
    windows = got.get("steps", {}).get("windows")
    if not windows:
        lines.append(f"{'steps':>14}  {why_missing(got.get('steps', {}))}")
        return lines
    lines.append(f"{'at s':>14}{'target':>10}{'ratio':>8}{'step':>10}  GPU state")
    for w in windows:
        ratio = f"{w['target_median_s'] / base:8.3f}" if base else f"{'':8}"
        lines.append(f"{w['t_s']:>14.1f}{1e3 * w['target_median_s']:10.3f}{ratio}{1e3 * w['step_median_s']:10.3f}  "
                     + _state_text(w))
    return lines


def _state_text(p: dict[str, Any]) -> str:
    parts = [f"{p[k]:g} {unit}" for k, unit in (("sm_mhz", "MHz SM"), ("mem_mhz", "MHz mem"), ("power_w", "W"),
                                                ("temp_c", "C")) if isinstance(p.get(k), float)]
    if p.get("throttle") not in (None, "", "0x0000000000000000"):
        parts.append(f"throttle {p['throttle']}")
    return ", ".join(parts)


def compare(measured: Path, gpu: str) -> str:
    """The three tables (module docstring): the same JSON and GPU give the same text."""
    doc = json.loads(measured.read_text())
    composer = Composer(gpu)
    versions = doc.get("versions", {})
    lines = [f"measured on {doc['device'].get('name')} ({'a CPU dry run' if doc.get('dry_run') else 'GPU'}; torch "
             f"{versions.get('torch')}, CUDA {versions.get('cuda')}; {doc['timer']['method']}; {doc['started']}), "
             f"composed for {gpu} as specbatch compose --gpu {gpu} prices it; ratio = measured / composed time"]
    lines += (decode_table(doc, composer) + kernels_table(doc, composer) + floor_table(doc) + ragged_table(doc)
              + sustained_table(doc) + sampler_table(doc, composer) + attention_table(doc, composer))
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI

def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time the terms on this machine's GPU (or a CPU dry run)")
    m.add_argument("--out", type=Path, required=True, help=f"folder for {RESULT}")
    m.add_argument("--budget", type=float, default=150.0, help="seconds for the whole run (default %(default)s)")
    m.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, a few seconds")
    m.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                   help="which sections, in this order (default: all)")
    c = sub.add_parser("compare", help="the measured points against the composition's price for them")
    c.add_argument("--measured", type=Path, default=DEFAULT_MEASURED, help="the measure's JSON (default %(default)s)")
    c.add_argument("--gpu", default="h200_sxm", help="the kernel data's GPU (default %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "measure":
        signal.signal(signal.SIGTERM, _interrupt)  # a machine's timeout: stop as Ctrl-C does, JSON written
        doc = measure(args.out, args.budget, args.dry_run, tuple(args.sections))
        return 130 if doc.get("interrupted") else 0
    if not args.measured.is_file():
        print(f"gpu_step_terms compare: no measured file {args.measured}: run 'gpu_step_terms.py measure --out DIR' "
              f"on a GPU and pass DIR/{RESULT} with --measured", file=sys.stderr)
        return 2
    from sim.errors import InputError

    try:
        print(compare(args.measured, args.gpu))
    except InputError as exc:
        print(f"gpu_step_terms compare: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
