"""Pricing one forward pass of a model from measured kernels, on one GPU of its group.

A pass over b sequences, q new tokens each, c tokens already cached, costs per layer

    sum of its GEMMs at m = b*q  (gemm table, interpolated in log m, log n, log k)
  + the experts at b*q tokens    (a mixture of experts: the MoE table, :mod:`.moe`)
  + attention                    (context table for prefill, generation table for decode)
  + memory-bound small ops       (bytes / the spec sheet's achievable bandwidth)
  + two all-reduces              (tensor parallelism: :mod:`.parallel`)

plus, once per pass, the embedding gather and final norm (bandwidth), the LM head
GEMM over the tokens that need logits, and with tensor parallelism the embedding's
all-reduce and the logits' all-gather. A model split over GPUs is priced per GPU with
its per-GPU shape (:meth:`~sim.compose.shapes.ModelShape.sharded`): the GPUs run the
same kernels at the same time, so one GPU's time is the pass's. Every term is NaN where
a table cannot price it; nothing is extrapolated past a table's edge.

Equivalences (each stated in the sidecar and tested in tests/test_compose.py):

* Work units. Decode attention reads each sequence's KV once per KV head and is
  independent across (sequence, KV head) pairs, so b sequences with H_kv KV heads cost
  what b * H_kv / h0 sequences with h0 KV heads and the same query heads per KV head cost.
  The generation table covers h0 = 1, 2, 4, 8; models with more KV heads (multi-head
  attention: OPT, Llama-2, llama-68m) are priced at h0 = 8, and a KV-head count the
  table lacks at the largest measured h0 below it.
* Head size. Where a table lacks the model's head size d (A100's tables hold d = 128
  only), H_kv heads of size d are priced as H_kv * d / d' heads of the next measured
  size d' that divides evenly, same query heads per KV head: the same KV bytes and FLOPs.
* Verification (q > 1 query tokens per sequence over c cached ones). FlashAttention packs
  the q tokens' query heads of one KV head into one tile of rows (pack-GQA), reading the
  KV once: a q-token pass is priced as a decode pass with q times the query heads per KV
  head over KV length c + q. A tile holds ``TILE_ROWS`` (64) rows per KV head; each
  further tile re-reads the KV and is priced as that many more sequences. Within a tile,
  where q x heads exceeds the widest head count the table measured, the pass is priced at
  that widest count: at a given KV size the tables are flat in head count (8 to 64 query
  heads over 8 KV heads within about 10% on H100), because the KV read is the cost.
* Batch splits. The generation tables stop at a total KV size (batch x KV length, about
  256k-512k tokens); past it, b sequences are priced as n launches of b / n (sequences are
  independent and each launch reads only its own KV: the tables are linear in batch there).
  Where a single sequence already leaves the table at the pass's head count (the widest
  head counts were measured to shorter KV lengths), it is priced at the widest narrower
  head count the table has there, by the same flatness in head count.
* Wide GEMMs. A GEMM wider than the table's largest n (the LM head of a 128k vocabulary)
  is priced as n_parts GEMMs of n / n_parts columns (same FLOPs, same weight bytes).
* Windowed layers (Mistral's sliding window, Llama 4's attention chunks: a window of the chunk
  size, an upper bound, as a chunk's tokens see 1 to chunk keys). A decode over context c reads
  min(c, window) keys per sequence: priced as full attention over that context. A prompt of p
  tokens longer than the window is priced as the causal prefill of the window plus p - window
  rows attending to window keys each, scaled from it by FLOPs: prefill(window) x (1 + 2 (p - window)
  / window).
* Unlike layers (a mixture of experts' dense layers) are priced as groups of like ones
  (:meth:`~sim.compose.shapes.ModelShape.layer_groups`).
* Multi-head latent attention (DeepSeek) is priced as a whole measured block, its projections
  included, by :mod:`sim.compose.mla`; its layers' GEMMs here are the MLP's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.compose.data import GpuSpec, attention_kernel
from sim.compose.interp import LogTable
from sim.compose.mla import MlaModule
from sim.compose.moe import ExpertsTable
from sim.compose.parallel import Collectives
from sim.compose.sampler import SAMPLING_MODES, sampler_time
from sim.compose.shapes import ACT_BYTES, ModelShape

KV_BYTES = 2  # bf16 KV cache (vLLM's kv_cache_dtype "auto" for a bf16 or fp8-weight model)
TABLE_KV_HEADS = 8  # the KV-head count MHA models are mapped onto (largest the generation table has)
TILE_ROWS = 64  # query rows per KV head one FlashAttention tile holds (pack-GQA): each tile reads the KV once


@dataclass
class KernelTables:
    """The measured tables of one GPU / framework / version / dtype, ready to interpolate."""

    spec: GpuSpec
    gemm: LogTable  # axes m, n, k at the requested dtype
    head_gemm: LogTable  # bf16 (the LM head stays bf16 under fp8 weight quantization)
    context: pd.DataFrame
    generation: pd.DataFrame
    kernels: dict[str, str] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)

    @classmethod
    def from_frames(cls, spec: GpuSpec, gemm: pd.DataFrame, context: pd.DataFrame, generation: pd.DataFrame,
                    gemm_dtype: str) -> "KernelTables":
        def gemm_table(dtype: str) -> tuple[LogTable, str]:
            rows = gemm[gemm.gemm_dtype == dtype]
            # one kernel per dtype in vLLM's tables, but block-scaled fp8 has several, each measured at the
            # m where vLLM dispatches it (FlashInfer up to 17 tokens, DeepGEMM from 32; CUTLASS's few shapes
            # at every m): at each m, the kernel measured over the most shapes there
            shapes = rows.groupby(["m", "kernel_source"]).size().reset_index(name="shapes")
            chosen = shapes.sort_values(["m", "shapes"], ascending=[True, False]).drop_duplicates("m")
            rows = rows.merge(chosen[["m", "kernel_source"]], on=["m", "kernel_source"])
            kernel = " + ".join(chosen.kernel_source.drop_duplicates())
            return LogTable.from_frame(rows, ("m", "n", "k")), kernel

        main, kernel = gemm_table(gemm_dtype)
        head, _ = gemm_table("bfloat16")
        def keep(frame: pd.DataFrame) -> pd.DataFrame:
            """Full attention (no sliding window), bf16 queries and KV cache (older tables lack some columns)."""
            wanted = {"window_size": 0, "kv_cache_dtype": "bfloat16", "attn_dtype": "bfloat16", "beam_width": 1}
            mask = np.ones(len(frame), dtype=bool)
            for column, value in wanted.items():
                if column in frame.columns:
                    mask &= (frame[column] == value).to_numpy()
            return frame[mask]

        return cls(spec, main, head, keep(context), keep(generation), {"gemm": kernel})

    def attention(self, which: str, kv_heads: int, head_dim: int) -> LogTable | None:
        """The (batch, length, heads) table for one KV-head count and head size; None if not measured."""
        key = (which, kv_heads, head_dim)
        if key not in self._cache:
            frame = self.context if which == "context" else self.generation
            kernel = attention_kernel(frame, head_dim, f"{which} attention table")
            self.kernels[f"{which}_attention"] = kernel
            rows = frame[(frame.kernel_source == kernel) & (frame.num_key_value_heads == kv_heads)
                         & (frame.head_dim == head_dim)]
            length = "isl" if which == "context" else "step"
            self._cache[key] = LogTable.from_frame(rows, ("batch_size", length, "num_heads")) if len(rows) else None
        return self._cache[key]

    def head_dims_measured(self, which: str) -> list[int]:
        frame = self.context if which == "context" else self.generation
        return sorted(set(frame.head_dim.astype(int)))

    def kv_heads_measured(self, which: str, head_dim: int) -> list[int]:
        frame = self.context if which == "context" else self.generation
        return sorted(set(frame.loc[frame.head_dim == head_dim, "num_key_value_heads"].astype(int)))


class PassPricer:
    """Forward-pass times of one model on one GPU of its group (seconds; NaN where the tables cannot price it).

    ``collectives``: the group's all-reduce and all-gather tables (a model split over more than
    one GPU); ``experts``: the MoE table of this model's experts (a mixture of experts);
    ``sampling``: what the sampler does per step (:mod:`sim.compose.sampler`); ``mla``: the
    latent-attention module's tables (DeepSeek)."""

    def __init__(self, model: ModelShape, tables: KernelTables, collectives: Collectives | None = None,
                 experts: ExpertsTable | None = None, sampling: str = "greedy", mla: MlaModule | None = None) -> None:
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling '{sampling}' is not one of {', '.join(SAMPLING_MODES)}")
        if model.tp > 1 and collectives is None:
            raise ValueError(f"{model.name} is split over {model.tp} GPUs: its collectives are needed")
        if model.is_moe and experts is None:
            raise ValueError(f"{model.name} is a mixture of experts: its MoE table is needed")
        if model.is_mla and mla is None:
            raise ValueError(f"{model.name} has latent attention: its MLA module tables are needed")
        self.mla = mla
        self.model = model
        self.tables = tables
        self.collectives = collectives
        self.experts = experts
        self.sampling = sampling
        self.bw = tables.spec.effective_bw

    # -- kernels --------------------------------------------------------------
    def gemm(self, m, n: int, k: int, table: LogTable | None = None) -> np.ndarray:
        """Wider than the table: equal column blocks; narrower (a mixture of experts' router, 8 columns):
        at the table's narrowest n, an upper bound where the weights are a few kB and the time is the
        launch and the activations' read."""
        table = table or self.tables.gemm
        n_low, n_top = table.bounds("n")
        parts = max(1, math.ceil(n / n_top))
        return parts * table(m=m, n=max(n / parts, n_low), k=k)

    def layer_gemms(self, tokens, layer: ModelShape | None = None) -> np.ndarray:
        """One layer's GEMMs, and a mixture of experts' fused experts kernel, at ``tokens`` tokens
        (``layer``: a group of :meth:`ModelShape.layer_groups`; default the model's)."""
        layer = layer or self.model
        shapes = layer.mlp_gemms() if layer.is_mla else layer.layer_gemms()  # latent attention's: in its module
        gemms = sum(self.gemm(tokens, n, k) for _, n, k in shapes)
        return gemms + self.experts(tokens) if layer.is_moe else gemms

    def pass_gemms(self, tokens) -> np.ndarray | float:
        """GEMMs run once per pass (a head's input fusion); 0 for a plain model."""
        return sum((self.gemm(tokens, n, k) for _, n, k in self.model.pass_gemms), 0.0)

    def lm_head(self, tokens) -> np.ndarray:
        """The (vocabulary-parallel) LM head over ``tokens`` tokens; split over GPUs, plus the logits' all-gather."""
        head = self.gemm(tokens, self.model.vocab, self.model.hidden_size, self.tables.head_gemm)
        if self.collectives is None:
            return head
        return head + self.collectives.all_gather(np.asarray(tokens, dtype=float) * self.model.vocab_size)

    def communication(self, tokens) -> tuple[np.ndarray | float, np.ndarray | float]:
        """All-reduces of a pass over ``tokens`` tokens: (per layer: after attention and after the MLP,
        once per pass: after the embedding); 0 on one GPU."""
        if self.collectives is None:
            return 0.0, 0.0
        one = self.collectives.all_reduce(tokens, self.model.hidden_size)
        return 2 * one, one

    def small_ops(self, tokens, layer: ModelShape | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Bandwidth-priced ops: (per layer, once per pass) seconds for ``tokens`` tokens."""
        per_layer, per_pass = (layer or self.model).small_op_elements_per_token()
        kv_write = 0 if self.model.is_mla else 2 * self.model.kv_heads * self.model.head_dim * KV_BYTES
        tokens = np.asarray(tokens, dtype=float)
        return tokens * (per_layer * ACT_BYTES + kv_write) / self.bw, tokens * per_pass * ACT_BYTES / self.bw

    def _units(self, which: str) -> tuple[float, int, LogTable | None]:
        """(sequence multiplier b'/b, KV heads h0, table) a pass is mapped onto (module docstring)."""
        m = self.model
        kv, head_dim = m.kv_heads, m.head_dim
        dims = self.tables.head_dims_measured(which)
        if head_dim not in dims:  # head-size equivalence: same KV bytes and FLOPs per token
            wider = [d for d in dims if d > head_dim and (kv * head_dim) % d == 0]
            if not wider:
                return 1.0, 0, None
            kv, head_dim = kv * head_dim // wider[0], wider[0]
        measured = self.tables.kv_heads_measured(which, head_dim)
        h0 = kv if kv in measured else max((h for h in measured if h <= min(kv, TABLE_KV_HEADS)), default=0)
        return (kv / h0 if h0 else 1.0), h0, (self.tables.attention(which, h0, head_dim) if h0 else None)

    def decode_attention(self, b, q, c) -> np.ndarray:
        """Generation attention: q query tokens per sequence over KV length c + q (one layer)."""
        if self.mla is not None:
            return self.mla.decode(b, q, c, self.model.heads)
        scale, h0, table = self._units("generation")
        if table is None:
            return np.full(np.broadcast(b, q, c).shape, np.nan)
        b, q, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (b, q, c)))
        rows = self.model.group * q  # query rows per KV head
        tiles = np.ceil(rows / TILE_ROWS)  # each tile reads the KV once: priced as more sequences
        low, top = table.bounds("num_heads")
        heads = np.clip(h0 * rows / tiles, low, top)  # the table's head count over h0 KV heads
        sequences, step = b * scale * tiles, c + q - 1
        price = np.full(rows.shape, np.nan)
        narrowing = 1.0  # where even one launch leaves the table, a narrower head count it measured (flat in heads)
        while np.isnan(price).any() and (heads / narrowing >= low).any():
            launches = 1.0  # past the table's KV-size edge: n launches of sequences / n (module docstring)
            while np.isnan(price).any() and launches <= sequences.max():
                todo = np.isnan(price) & (sequences / launches >= 1) & (heads / narrowing >= low)
                price = np.where(todo, launches * table(batch_size=sequences / launches, step=step,
                                                        num_heads=heads / narrowing), price)
                launches *= 2
            narrowing *= 2
        return price

    def context_attention(self, b, p) -> np.ndarray:
        """Prefill attention of b prompts of p tokens (causal, no cached prefix; one layer)."""
        if self.mla is not None:
            return self.mla.prefill(b, p, self.model.heads)
        scale, h0, table = self._units("context")
        if table is None:
            return np.full(np.broadcast(b, p).shape, np.nan)
        b = np.asarray(b, dtype=float)
        return table(batch_size=b * scale, isl=p, num_heads=h0 * self.model.group)

    def windowed_context_attention(self, b, p, window: int) -> np.ndarray:
        """Prefill attention of one layer attending to the last ``window`` tokens (0: all; module docstring)."""
        if not window:
            return self.context_attention(b, p)
        p = np.asarray(p, dtype=float)
        return self.context_attention(b, np.minimum(p, window)) * (1 + 2 * np.maximum(p - window, 0) / window)

    def layers_attention(self, per_layer) -> np.ndarray:
        """Attention summed over the layers: ``per_layer(window)`` prices one layer of each kind."""
        return sum(layers * per_layer(window) for layers, window in self.model.attention_groups())

    # -- passes ---------------------------------------------------------------
    def _parts(self, tokens, attention, logits) -> dict[str, np.ndarray]:
        """A pass's time by kind (``attention``: all layers'); GEMMs include the experts; communication
        only when split over GPUs."""
        _, pass_small = self.small_ops(tokens)
        groups = self.model.layer_groups()
        gemm = sum(group.num_layers * self.layer_gemms(tokens, group) for group in groups)
        if self.model.pass_gemms:
            gemm = gemm + self.pass_gemms(tokens)
        small = sum(group.num_layers * self.small_ops(tokens, group)[0] for group in groups)
        parts = {"gemm": gemm, "attention": attention,
                 "small_ops": small + pass_small, "lm_head": self.lm_head(logits)}
        if self.collectives is not None:
            layer_comm, pass_comm = self.communication(tokens)
            parts["communication"] = self.model.num_layers * layer_comm + pass_comm
        return parts

    def prefill_parts(self, b, p) -> dict[str, np.ndarray]:
        b, p = np.broadcast_arrays(np.asarray(b, dtype=float), np.asarray(p, dtype=float))
        return self._parts(b * p, self.layers_attention(lambda w: self.windowed_context_attention(b, p, w)), b)

    def decode_parts(self, b, q, c, logits_per_sequence=None) -> dict[str, np.ndarray]:
        """``logits_per_sequence``: None = all q tokens (a verification pass), else that many."""
        b, q, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (b, q, c)))
        tokens = b * q
        logits = tokens if logits_per_sequence is None else b * logits_per_sequence
        attention = self.layers_attention(lambda w: self.decode_attention(b, q, np.minimum(c, w) if w else c))
        return self._parts(tokens, attention, logits)

    def prefill(self, b, p) -> np.ndarray:
        return sum(self.prefill_parts(b, p).values())

    def decode(self, b, q, c, logits_per_sequence=None) -> np.ndarray:
        return sum(self.decode_parts(b, q, c, logits_per_sequence).values())

    def mixed(self, b: int, q: int, c: float, chunks: list[tuple[int, int]]) -> float:
        """A vllm-v1 mixed pass (docs/scheduling.md): b sequences decoding q tokens each over
        context c, plus prefill chunks of q_j new tokens after s_j cached ones.

        GEMMs and small ops run once over the step's total tokens; attention is priced per
        part at its own context: the decodes as a generation pass, a chunk as the causal
        prefill of s_j + q_j tokens less that of s_j (its queries' work over its own prefix);
        logits for the decodes' tokens and one per chunk.
        """
        tokens = b * q + sum(new for _, new in chunks)

        def one_layer(window: int) -> float:
            attention = float(self.decode_attention(b, q, min(c, window) if window else c)) if b else 0.0
            for cached, new in chunks:
                attention += float(self.windowed_context_attention(1, cached + new, window))
                if cached:
                    attention -= float(self.windowed_context_attention(1, cached, window))
            return attention

        return float(sum(self._parts(float(tokens), self.layers_attention(one_layer), b * q + len(chunks)).values()))

    def verify(self, b, k, sampling: str | None = None) -> np.ndarray:
        """Sampling over the vocabulary as vLLM V1's sampler runs it for ``sampling`` (default: this
        pricer's; :mod:`sim.compose.sampler`): b sequences verifying k draft tokens each (k = 0: decoding).
        Per sequence this is vocabulary-sized work: 128k columns for Llama-3 against 32k for Llama-2."""
        spec = self.tables.spec
        return sampler_time(b, k, self.model.vocab_size, sampling or self.sampling, self.bw, spec.mem_bw,
                            spec.mem_latency_s)
