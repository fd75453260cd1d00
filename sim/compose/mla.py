"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) priced from the kernel data's MLA module tables.

vLLM runs a latent-attention layer as one block: the fused down projection (query latent, KV latent,
shared rotary key), their norms, the up projections, rotary, the cache write, the attention kernel
(decode: over the cached latents with the key and value up projections absorbed into the query and
output; prefill: keys and values expanded per head) and the output projection. The kernel data times
that whole block (``mla/<framework>/<version>/mla_{context,generation}_module_perf.parquet``) at
DeepSeek-V3's dimensions, per GPU-local head count (1 to 128), weight dtype and KV-cache dtype: the
context table over (prompts, prompt length), the generation table over (sequences, KV length).

So a latent-attention layer's attention *and* its projections come from these tables; the rest of the
layer (the MLP or experts, the norms around the block, the all-reduces) is priced as for any model.

Equivalences, each stated in the profile's sidecar:

* Backend. The KV cache stays bf16 (as for every composed model), so the tables' backend measured
  with a bf16 cache is used (FlashAttention-MLA on Hopper, FlashInfer-MLA on Blackwell, Triton-MLA on
  Ada); its long prompts were measured under vLLM's FlashAttention prefill path (``FLASH_ATTN``
  rows) and join its short ones.
* Verification and multi-token decode. Every head of a sequence reads the same cached latents
  (multi-query attention over the latent), so q query tokens of h local heads are priced as one token
  of q x h heads over KV length c + q - 1, as the FlashMLA-style kernels pack them; past the
  table's widest head count (128), as more sequences. The module's per-token down projection then
  counts one token per sequence instead of q: a weight-bound GEMM at decode sizes.
* Batch splits. Off the table's edge in sequences (or prompts) x length, b sequences are priced as
  n launches of b / n, as for the attention tables (:mod:`sim.compose.price`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.compose.interp import LogTable
from sim.errors import InputError

CONTEXT_TABLE = ("mla", "mla_context_module_perf.parquet")
GENERATION_TABLE = ("mla", "mla_generation_module_perf.parquet")
# the dimensions the module tables were measured at (DeepSeek-V3, also Kimi K2's)
MEASURED_SHAPE = {"hidden_size": 7168, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                  "qk_rope_head_dim": 64, "v_head_dim": 128}
BACKENDS = ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA")  # preferred first, with a bf16 KV cache
PREFILL_PATH = "FLASH_ATTN"  # vLLM's prefill path for long prompts, timed under its own name
MODULE_DTYPES = {"bf16": "bfloat16", "fp8-block": "fp8_block"}  # --dtype -> the tables' gemm_type


def shape_problem(shape) -> tuple[str, str] | None:
    """(field, why) where a latent-attention shape is not the one the tables measured; None if it is."""
    for field, measured in MEASURED_SHAPE.items():
        if getattr(shape, field) != measured:
            return field, (f"{shape.name} has {field} {getattr(shape, field)}: the kernel data's MLA module tables "
                           f"were measured at DeepSeek-V3's latent attention ({field} {measured}), and another shape "
                           "is not priced")
    return None


@dataclass(frozen=True)
class MlaModule:
    """One latent-attention block on one GPU: seconds per layer."""

    context: LogTable  # axes batch_size, isl, num_heads
    generation: LogTable  # axes batch_size, step, num_heads
    backend: str

    @classmethod
    def from_frames(cls, context: pd.DataFrame, generation: pd.DataFrame, dtype: str, source: str) -> "MlaModule":
        """The rows of the bf16 KV cache at ``dtype``'s projections; what the data lacks is one line."""
        if dtype not in MODULE_DTYPES:
            raise InputError(f"the MLA module tables were measured with {' or '.join(MODULE_DTYPES)} projections, "
                             f"not {dtype}", source=source, field="dtype")
        gemm_type = MODULE_DTYPES[dtype]

        def rows(frame: pd.DataFrame) -> pd.DataFrame:
            return frame[(frame.kv_cache_dtype == "bfloat16") & (frame.gemm_type == gemm_type)]

        context, generation = rows(context), rows(generation)
        present = set(generation.kernel_source)
        backend = next((b for b in BACKENDS if b in present), None)
        if backend is None:
            raise InputError(f"no MLA decode module measured with a bf16 KV cache and {gemm_type} projections "
                             f"(measured: {', '.join(sorted(present)) or 'none'})", source=source, field="dtype")
        own = context[context.kernel_source == backend]
        longer = context[(context.kernel_source == PREFILL_PATH) & (context.isl > own.isl.max())]
        return cls(LogTable.from_frame(pd.concat([own, longer]), ("batch_size", "isl", "num_heads")),
                   LogTable.from_frame(generation[generation.kernel_source == backend],
                                       ("batch_size", "step", "num_heads")), backend)

    def prefill(self, b, p, heads: int) -> np.ndarray:
        """b prompts of p tokens, causal, ``heads`` heads on this GPU."""
        b, p = np.broadcast_arrays(np.asarray(b, dtype=float), np.asarray(p, dtype=float))
        return _split(lambda n: self.context(batch_size=n, isl=p, num_heads=heads), b)

    def decode(self, b, q, c, heads: int) -> np.ndarray:
        """b sequences of q query tokens over c cached ones (module docstring: heads packing)."""
        b, q, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (b, q, c)))
        rows = q * heads
        widest = self.generation.bounds("num_heads")[1]
        groups = np.ceil(rows / widest)
        return _split(lambda n: self.generation(batch_size=n, step=c + q - 1, num_heads=rows / groups), b * groups)


def _split(price, sequences: np.ndarray) -> np.ndarray:
    """``price(n)`` for every sequence count; where off the table, n launches of sequences / n."""
    out = np.full(sequences.shape, np.nan)
    launches = 1.0
    while np.isnan(out).any() and launches <= max(float(sequences.max(initial=1.0)), 1.0):
        todo = np.isnan(out) & (sequences / launches >= 1)
        if todo.any():
            out = np.where(todo, launches * price(np.maximum(sequences / launches, 1.0)), out)
        launches *= 2
    return out
