"""A mixture-of-experts layer priced from the kernel data's measured fused-MoE kernel.

The data (``moe/<framework>/<version>/moe_perf.parquet``) times vLLM's ``fused_experts``
(all experts' gate/up GEMM, the activation and the down GEMM, token permutation included) for
a model's exact shape (hidden size, each expert's intermediate size, experts, top-k), per
tensor-parallel size (each GPU holds every expert, split along its intermediate size: vLLM's
default without expert parallelism), weight dtype, and *routing distribution*: how the
router's choices spread over the experts in the timed kernel. ``balanced`` (every expert
gets the same share of the tokens) is the default assumption here; ``power_law_1.01`` and
``power_law_1.2`` are skewed routings the data also measured (one expert busier than the
rest, so the step waits on it). A real router sits in between and varies by prompt; the
profile's sidecar names the one chosen.

What the table does not hold is priced by the rest of the pass: the router's GEMM (hidden ->
experts, a GEMM of the step's tokens), its top-k (a memory-bound op over the experts' logits)
and the all-reduce after the layer. A step of more tokens than the table's largest
(16,384) is priced as equal launches (vLLM chunks fused MoE the same way; the kernel is
linear in tokens there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.compose.interp import LogTable
from sim.errors import InputError

ROUTINGS = ("balanced", "power_law_1.01", "power_law_1.2")
MOE_DTYPES = {"bf16": "bfloat16", "fp8": "fp8", "fp8-block": "fp8_block"}  # --dtype -> the table's moe_dtype
# (fp8: per-tensor w8a8; fp8-block: 128 x 128 block scales, DeepSeek-V3's checkpoints)


@dataclass(frozen=True)
class ExpertsTable:
    """One model's experts on one GPU of its group: seconds for a step of n tokens."""

    table: LogTable  # axis: num_tokens
    kernel: str
    routing: str

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, *, hidden: int, intermediate: int, experts: int, top_k: int, tp: int,
                   dtype: str, routing: str, source: str) -> "ExpertsTable":
        """The rows of this exact shape; a shape, split, dtype or routing the data lacks is one line."""
        shape = frame[(frame.hidden_size == hidden) & (frame.inter_size == intermediate)
                      & (frame.num_experts == experts) & (frame.topk == top_k)]
        if shape.empty:
            have = sorted({(int(r.hidden_size), int(r.inter_size), int(r.num_experts), int(r.topk))
                           for r in frame.itertuples()})
            raise InputError(f"the MoE table has no experts of hidden {hidden}, intermediate {intermediate}, "
                             f"{experts} experts, top {top_k} (it has (hidden, intermediate, experts, top-k): "
                             f"{', '.join(map(str, have))})", source=source, field="target")
        rows = shape[(shape.moe_tp_size == tp) & (shape.moe_ep_size == 1)]
        if rows.empty:
            raise InputError(f"the MoE table has this model's experts at tensor-parallel sizes "
                             f"{sorted(set(shape[shape.moe_ep_size == 1].moe_tp_size.astype(int)))}, not {tp}",
                             source=source, field="tp")
        wanted = MOE_DTYPES[dtype]
        typed = rows[rows.moe_dtype == wanted]
        if typed.empty:
            raise InputError(f"the MoE table has no {wanted} experts of this shape at tp {tp} (it has: "
                             f"{', '.join(sorted(set(rows.moe_dtype)))})", source=source, field="dtype")
        routed = typed[typed.distribution == routing]
        if routed.empty:
            raise InputError(f"the MoE table has no '{routing}' routing for this shape (it has: "
                             f"{', '.join(sorted(set(typed.distribution)))})", source=source, field="moe-routing")
        kernel = routed.kernel_source.value_counts().index[0]
        return cls(LogTable.from_frame(routed[routed.kernel_source == kernel], ("num_tokens",)), kernel, routing)

    def __call__(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=float)
        top = self.table.bounds("num_tokens")[1]
        launches = np.maximum(1.0, np.ceil(tokens / top))
        return launches * self.table(num_tokens=tokens / launches)
