"""How a replica is assembled, once: the simulator, the cluster and the real replay all build theirs here.

A run's replicas share a :class:`ReplicaPlan` (the step table, the engine's settings, the KV
budget, the compiled-or-interpreted rules); each gets its own scheduler, policy instance,
acceptance sampler and queue, so replicas never share state.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from sim.costmodel.model import StepTable
from sim.jit import use_compiled
from sim.scheduler import kv_reserve, make_scheduler
from sim.serving.compiled import compiled_runs_for
from sim.serving.loop import Rules, ServingLoop
from sim.serving.priced import PricedBackend
from sim.serving.queues import request_inputs


@dataclass(frozen=True)
class ReplicaPlan:
    """What every replica of a run is built from."""

    table: StepTable
    engine: object  # the run's EngineConfig
    kv_budget_tokens: int
    max_k: int  # the policy's largest k: v0 reserves its slots
    max_blocks_per_request: int = 1  # vllm-v1: the longest block table a request can need
    num_keys: int = 0  # vllm-v1: shared prefix-cache keys (sim.scheduler.kvcache.prefix_keys)
    lookahead: int | None = None  # vllm-v1's slots kept ahead per request (None: max_k; the method's, sim.speculation.methods)
    lag_mode: int = 1  # how the drafter's lag moves (sim.speculation.methods LAG_*; 0: no drafter to catch up)
    requests: int = 0  # the run's requests: on a cold compiled-code cache a small run is interpreted (sim.jit)

    @cached_property
    def compiled(self) -> bool:
        """Decided once per run: every replica of a cluster runs the same way."""
        return use_compiled(self.engine.jit, self.requests)

    def scheduler(self):
        """A fresh scheduler for one replica."""
        e = self.engine
        return make_scheduler(e.batching, e.max_batch_size, self.kv_budget_tokens, e.prefill, e.scheduler,
                              max_num_batched_tokens=e.max_num_batched_tokens, block_size=e.block_size,
                              chunked_prefill=e.chunked_prefill, prefix_caching=e.enable_prefix_caching,
                              async_scheduling=e.async_scheduling,
                              lookahead=self.max_k if self.lookahead is None else self.lookahead)

    def inputs(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, prefix_keys: np.ndarray | None,
               remote_tokens: np.ndarray | None = None) -> np.ndarray:
        """The per-request int block the replicas' queues hold (sim/serving/queues.py); ``remote_tokens``: a
        disaggregated decode replica's, the prompt tokens whose KV a prefill replica sends."""
        return request_inputs(prompt_tokens, output_tokens, kv_reserve(prompt_tokens, output_tokens, self.max_k),
                              prefix_keys, remote_tokens)

    def loop(self, queue, policy, sampler, backend=None) -> ServingLoop:
        """One replica's serving loop over ``queue``: priced by the step table unless a ``backend`` runs
        its steps (the real replay, a playback), with compiled runs where they apply."""
        scheduler = self.scheduler()
        compiled = self.compiled
        rules = Rules(compiled)
        if sampler is not None:
            sampler.use_rules(rules)
        loop = ServingLoop(queue, scheduler=scheduler, policy=policy, k_max=self.table.k_max,
                           backend=backend or PricedBackend(self.table, sampler, compiled),
                           rules=rules, max_blocks_per_request=self.max_blocks_per_request,
                           num_keys=self.num_keys, lag_mode=self.lag_mode,
                           proposals=None if sampler is None else sampler.proposals)
        if sampler is not None:
            sampler.watch(loop)
        loop.compiled_runs = compiled_runs_for(loop, self.table, sampler, compiled)
        return loop
