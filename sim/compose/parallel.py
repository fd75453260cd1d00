"""What tensor parallelism adds to a pass: the collectives between the GPUs of a replica.

vLLM's tensor-parallel layers (``vllm/model_executor/layers/linear.py``,
``vocab_parallel_embedding.py``, ``logits_processor.py``) communicate in three places:

* after each row-parallel projection (attention output, MLP down or the experts), an
  all-reduce of the layer's output, tokens x hidden elements: twice a layer;
* after the vocabulary-parallel embedding, an all-reduce of tokens x hidden: once a pass;
* after the vocabulary-parallel LM head, an all-gather of the logits (vLLM V1 gathers on
  every GPU): tokens-with-logits x vocabulary elements, once a pass.

The all-reduces are priced, first, from the kernel data's vLLM all-reduce table (``comm/vllm/<version>/
custom_allreduce_perf.parquet``: ``tensor_model_parallel_all_reduce`` as vLLM dispatches it,
its custom all-reduce for small messages, NCCL or symmetric memory for large ones, timed per
GPU count and message size in elements), captured in a CUDA graph for steps up to vLLM's
largest capture size (512 tokens) and eager above it, as vLLM runs them. That table replays one
all-reduce after another in a graph on otherwise idle GPUs, which reach each barrier together.
In a running model each of a layer's two all-reduces follows GPU-local work (the row-parallel
GEMM) and waits for the slowest GPU before its exchange completes: it costs at least one
synchronising collective, which is what nccl-tests time (``all_reduce`` in the NCCL table, each
op a full handshake between the GPUs; on two H100s about 6 us at the smallest message against
the graph table's 4 us). So a running model's all-reduce is priced at the larger of the two
tables at its message size (where the NCCL table has no all-reduce: the framework's alone). The
skew between the GPUs beyond that handshake is not priced: no independent data gives it. The all-gather is
priced from NCCL's table (``comm/nccl/<version>/nccl_perf.parquet``, nccl-tests, the newest
NCCL version the data has; message size = the gathered elements). A message larger than a
table's largest is priced as that many equal parts (the tables are linear in size there),
as wide GEMMs are split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.compose.interp import LogTable

GRAPH_TOKENS = 512  # vLLM V1's largest CUDA-graph capture size by default: larger steps run eager
ELEMENT_BYTES = 2  # bf16 activations and logits


@dataclass(frozen=True)
class Collectives:
    """The collectives of one tensor-parallel group of ``gpus`` GPUs (seconds; NaN off the tables)."""

    gpus: int
    reduce_graph: LogTable  # all-reduce captured in a CUDA graph; axis: message_size (elements)
    reduce_eager: LogTable  # all-reduce run eagerly
    gather: LogTable  # NCCL all-gather
    sources: dict  # the tables' kernels and versions, for the sidecar
    reduce_floor: LogTable | None = None  # NCCL all-reduce (nccl-tests): a synchronising collective's price

    @classmethod
    def from_frames(cls, gpus: int, all_reduce: pd.DataFrame, nccl: pd.DataFrame, sources: dict) -> "Collectives":
        def table(rows: pd.DataFrame) -> LogTable:
            return LogTable.from_frame(rows[rows.num_gpus == gpus], ("message_size",))

        ar = all_reduce[all_reduce.allreduce_dtype == "bfloat16"]
        gather = nccl[(nccl.op_name == "all_gather") & (nccl.nccl_dtype == "half")]
        reduce = nccl[(nccl.op_name == "all_reduce") & (nccl.nccl_dtype == "half") & (nccl.num_gpus == gpus)]
        return cls(gpus, table(ar[ar.backend == "vllm_graph"]), table(ar[ar.backend == "vllm_eager"]),
                   table(gather), sources, table(reduce) if len(reduce) else None)

    @staticmethod
    def _split(table: LogTable, elements) -> np.ndarray:
        """The table at ``elements``, a message past its top priced as equal parts."""
        elements = np.asarray(elements, dtype=float)
        top = table.bounds("message_size")[1]
        parts = np.maximum(1.0, np.ceil(elements / top))
        low = table.bounds("message_size")[0]
        return parts * table(message_size=np.maximum(elements / parts, low))

    def kernel_all_reduce(self, tokens, hidden: int) -> np.ndarray:
        """The framework's all-reduce kernel alone, as its table times it back to back (graph-captured up
        to GRAPH_TOKENS tokens). Messages below the table's smallest are priced at it (a launch-bound
        floor: the tables are flat there)."""
        tokens = np.asarray(tokens, dtype=float)
        graph = self._split(self.reduce_graph, tokens * hidden)
        eager = self._split(self.reduce_eager, tokens * hidden)
        return np.where(tokens <= GRAPH_TOKENS, graph, eager)

    def all_reduce(self, tokens, hidden: int) -> np.ndarray:
        """One all-reduce of ``tokens`` x ``hidden`` bf16 elements in a running model: the framework's
        kernel, and at least a synchronising NCCL all-reduce of that message (the module docstring)."""
        kernel = self.kernel_all_reduce(tokens, hidden)
        if self.reduce_floor is None:
            return kernel
        return np.maximum(kernel, self._split(self.reduce_floor, np.asarray(tokens, dtype=float) * hidden))

    def all_gather(self, elements) -> np.ndarray:
        """One all-gather whose result holds ``elements`` bf16 elements (below the table's smallest: its floor)."""
        return self._split(self.gather, elements)


def newest(versions: list[str]) -> str:
    """The newest of version strings like '2.23', '2.27.3' (numerically, not as text)."""
    def key(text: str) -> tuple:
        return tuple(int(part) if part.isdigit() else 0 for part in text.split("."))

    return max(versions, key=key)

