"""Step times from a calibrated profile (docs/cost-model.md; its place in the code: docs/architecture.md).

A speculative decode step over b sequences with mean context c and speculation
length k costs

    k * t_draft(b, c) + t_target(b, q = k + 1, c) + t_verify(b, k) + t_overhead

plus, when the draft lags L > 1 tokens behind (it has not seen the last draft token of
a fully accepted step, or tokens emitted by k = 0 steps), t_draft(b, q = L, c) -
t_draft(b, q = 1, c) for its first pass feeding them all (the engine tracks L per row);

and k = 0 is one target pass over one token plus sampling (t_verify(b, 0)). A
prefill of b prompts of mean length p costs t_prefill_target(b, p) + t_overhead,
plus t_prefill_draft(b, p) when the run speculates. t_overhead (per phase) is the
engine's own time per step outside the timed passes, measured by calibration with a
short real replay (0 for profiles that predate it); a decode step's may grow with its
running rows, t_overhead + b * t_overhead_row, where calibration replayed at several batch
sizes (calibrate.overhead; 0 otherwise). Every number comes from the
profile's curves; nothing here is a constant of its own.

How the engine's own work combines with the passes is the profile's too
(``engine_overhead`` in its sidecar): by default it adds, t = t_passes + t_exposed +
t_overhead; with ``"overlap": "async"`` (vLLM V1's asynchronous scheduling, the CPU
preparing step n + 1 while the GPU runs step n) a step takes the longer of the two,
t = max(t_passes + t_exposed, t_overhead). t_exposed is per-step time that no overlap
hides (0 unless given or fitted, ``specbatch fit``).

A vllm-v1 step table of a CUDA profile also pads steps to vLLM's CUDA-graph capture sizes
(:func:`cuda_graph_sizes`): a step of T tokens, T at most the largest size, runs the
graph of the next size up, so its linear layers work on that many rows; the padded rows
hold no context, so attention and the KV reads are the real rows' alone. A profile holds
whole passes, not their parts; the pass whose rows are nearly all linear-layer work is a
one-prompt prefill, so what the padded rows add is P(b' (k + 1)) - P(b (k + 1))
(:meth:`CostModel.padding_times`; composed profiles price P from one token up).

A *mixed* step of the vllm-v1 scheduler (docs/scheduling.md) runs the decodes of b
sequences at k and Q prefill-chunk tokens in one pass. With P(x) = t_prefill_target(1, x)
(+ t_prefill_draft(1, x) when the run speculates), one x-token prompt's prefill, and
D = b (k + 1) the decodes' tokens:

    t_mixed = t_decode_step(b, k, c) + P(D + Q) - P(D) + X(Q, S)      (b > 0)
    t_mixed = P(Q) + X(Q, S) + t_overhead_prefill                     (chunks only)

(D and D + Q padded to the CUDA-graph sizes where they fit one), where S is the sum of
the tokens each chunk's request already has in the KV cache (computed earlier, or found
by prefix caching) and X is those chunks' attention to them:

    X(Q, S) = max(kappa S, 2 theta Q S)

kappa is the target's cost of reading one more token of KV cache in a decode pass (the
decode curve's slope over context at the table's largest batch: what a full GPU pays to
read it) and theta the prefill curve's fitted attention coefficient (t ~ theta p^2 for a
causal p-token prompt, so Q new tokens after S cached ones add 2 theta Q S): a chunk
reads its prefix's KV once (memory) and its queries attend to all of it (compute).

The chunks' tokens continue the pass's token axis after the decodes': what they add is
what Q more tokens cost a pass already at D tokens, so the linear layers are charged at
the step's total tokens, knee included (a memory-bound pass takes a short chunk almost
free). Among themselves their attention is the prompt curve's (P's causal part); X adds
what they attend to before them. A whole uncached prompt alone costs exactly the v0
prefill of one prompt. Against the kernel-composed mixed pass (sim.compose.price.PassPricer.mixed) this
is checked in tests/test_scheduling_v1.py and shown in docs/scheduling.md.

**Drafters** (:class:`Drafter`, docs/speculation-methods.md). The formula above is a separate
draft model's. The other methods replace ``k * t_draft(b, c)`` and the draft's prefill:

* a head (EAGLE, EAGLE-3, MTP): t_head(b, q = k + 1, c) + (k - 1) t_head(b, q = w, c): its first pass
  runs over the k + 1 positions the target just verified (their hidden states), the others over
  w = 1 token per sequence (a tree: its top-k); a prompt costs t_head_prefill(b, p); a lag of L
  tokens adds t_head(b, 1 + L, c) - t_head(b, 2, c) (more tokens in that first pass);
* Medusa's heads: one pass of k heads, t_medusa(b, k); no KV, no prefill, no catch-up;
* a host matcher (n-gram, suffix): the proposer's host time t_propose(b, k, c), no GPU pass.

A tree verifies q(k) tokens per sequence (the root and the tree's nodes down to depth k) instead
of k + 1: t_target(b, q(k), c) + t_verify(b, q(k) - 1).

The engine never interpolates per step: :meth:`CostModel.tabulate` evaluates the
curves once, vectorised, over every (b, k, context) a run can reach, and
:class:`StepTable` answers per step with two list look-ups and a linear blend.
"""

from __future__ import annotations

import bisect
import copy
import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from sim.costmodel.rules import blend as _blend
from sim.costmodel.rules import (catch_up_price, chunk_price, decode_price, padded_step, prefix_attention_price,
                                 tokens_price)
from sim.costmodel.curves import Curve, decode_features, prefill_features, verify_features
from sim.costmodel.profile import Profile

class DrafterKind(StrEnum):
    """Whose drafting a step pays for (the module docstring), decided once when a drafter is made."""

    MODEL = "model"  # a separate draft model: its own passes, prefill and catch-up
    HEAD = "head"  # a head on the target's hidden states (EAGLE, MTP)
    HEADS = "heads"  # Medusa's heads: one pass, no context
    HOST = "host"  # a host-side matcher (n-gram, suffix): proposes only where the context matches


@dataclass(frozen=True)
class Drafter:
    """How a method's drafting is priced (the module docstring): ``kind`` model, head, heads or host;
    ``curve``: the profile's model holding its passes; ``width``: tokens per sequence in a head's later
    passes (a tree's top-k); ``tree_tokens[k]``: tokens a tree verifies at depth k (empty: k + 1)."""

    kind: DrafterKind = DrafterKind.MODEL
    curve: str = "draft"
    width: int = 1
    tree_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DrafterKind(self.kind))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "curve": self.curve, "width": self.width, "tree_tokens": list(self.tree_tokens)}

    @classmethod
    def of(cls, value: "Drafter | dict | None") -> "Drafter":
        if value is None or isinstance(value, Drafter):
            return value or DRAFT_MODEL
        return cls(value["kind"], value["curve"], int(value["width"]), tuple(int(t) for t in value["tree_tokens"]))


DRAFT_MODEL = Drafter()

FAR_BEYOND = 1.1  # warn when a run can reach more than 10% past the grid's largest measured value
TABLE_COLUMNS = 256
CATCH_UP_LAGS = 9  # draft lags tabulated per step table (0..9); longer ones extrapolate linearly  # context (and prompt) columns of a StepTable: fine enough for linear blending


class CostModel:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.k_max = profile.k_max
        self.prefill_target = Curve.from_points("prefill/target", profile.phase("prefill", "target"),
                                                ("batch_size", "query_tokens"), prefill_features)
        # A target-only profile (profile.has_draft False) has no draft curves: its runs never speculate.
        self.prefill_draft = self.decode_draft = None
        self.draft_measures_q = False
        if profile.has_draft:
            self.prefill_draft = Curve.from_points("prefill/draft", profile.phase("prefill", "draft"),
                                                   ("batch_size", "query_tokens"), prefill_features)
            draft = profile.phase("decode", "draft")
            # Profiles before draft catch-up was measured hold the draft at q = 1 only.
            self.draft_measures_q = draft.query_tokens.nunique() > 1
            self.decode_draft = (Curve.from_points("decode/draft", draft,
                                                   ("batch_size", "query_tokens", "context_tokens"), decode_features)
                                 if self.draft_measures_q else
                                 Curve.from_points("decode/draft", draft, ("batch_size", "context_tokens"),
                                                   _draft_features))
        self.decode_target = Curve.from_points("decode/target", profile.phase("decode", "target"),
                                               ("batch_size", "query_tokens", "context_tokens"), decode_features)
        self.verify = Curve.from_points("verify", profile.phase("verify", "target"), VERIFY_AXES, verify_features)
        self.decode_overhead = profile.engine_overhead_s("decode")  # t_overhead, per step
        self.decode_overhead_per_row = profile.engine_overhead_per_row_s("decode")  # and per running row
        self.prefill_overhead = profile.engine_overhead_s("prefill")
        self.exposed_overhead = profile.exposed_overhead_s  # t_exposed, per step, never hidden
        self.overlapped = profile.overhead_overlapped
        self.cuda_graphs = graphed(profile.meta)  # vLLM pads steps to its graphs
        self.drafters = drafter_curves(profile)  # "decode/eagle3", "prefill/eagle3", "decode/medusa", "propose/ngram"
        self.drafter = DRAFT_MODEL  # the drafting this model prices (with_drafter)
        self.samplers = sampler_curves(profile)  # "greedy", "random", "top-p": verification at each (with_sampling)
        self.sampling = profile.sampling  # the sampling self.verify prices

    @property
    def curves(self) -> list[Curve]:
        """The fitted curves (a target-only profile's: the target's and verification)."""
        return [c for c in (self.prefill_target, self.prefill_draft, self.decode_draft, self.decode_target,
                            self.verify) if c is not None]

    _CURVES = ("prefill_target", "prefill_draft", "decode_draft", "decode_target", "verify")

    def state(self) -> dict[str, np.ndarray]:
        """The fitted model as named arrays (what :mod:`sim.costmodel.cache` stores): :meth:`from_state` rebuilds
        it without fitting, equal to the last bit."""
        out = {"k_max": np.int64(self.k_max), "draft_measures_q": np.bool_(self.draft_measures_q),
               "decode_overhead": np.float64(self.decode_overhead),
               "decode_overhead_per_row": np.float64(self.decode_overhead_per_row),
               "prefill_overhead": np.float64(self.prefill_overhead),
               "exposed_overhead": np.float64(self.exposed_overhead), "overlapped": np.bool_(self.overlapped),
               "cuda_graphs": np.bool_(self.cuda_graphs)}
        for attr in self._CURVES:
            curve = getattr(self, attr)
            if curve is None:  # a target-only profile's draft curves
                continue
            out[f"{attr}/axes"] = np.array(curve.axes)
            out[f"{attr}/features"] = np.array(curve.features.__name__)
            out.update({f"{attr}/{key}": value for key, value in curve.state().items()})
        out["sampling"] = np.array(self.sampling)
        out["samplers"] = np.array(sorted(self.samplers), dtype=str)
        for name, curve in self.samplers.items():
            out.update({f"sampler:{name}/{key}": value for key, value in curve.state().items()})
        out["drafters"] = np.array(sorted(self.drafters), dtype=str)
        for name, curve in self.drafters.items():
            out[f"drafter:{name}/axes"] = np.array(curve.axes)
            out[f"drafter:{name}/features"] = np.array(curve.features.__name__)
            out.update({f"drafter:{name}/{key}": value for key, value in curve.state().items()})
        return out

    @classmethod
    def from_state(cls, profile: Profile, state) -> "CostModel":
        model = cls.__new__(cls)
        model.profile = profile
        model.k_max = int(state["k_max"])
        model.draft_measures_q = bool(state["draft_measures_q"])
        model.decode_overhead = float(state["decode_overhead"])
        model.decode_overhead_per_row = float(state["decode_overhead_per_row"])
        model.prefill_overhead = float(state["prefill_overhead"])
        model.exposed_overhead = float(state["exposed_overhead"])
        model.overlapped = bool(state["overlapped"])
        model.cuda_graphs = bool(state["cuda_graphs"])
        features = {f.__name__: f for f in (decode_features, prefill_features, verify_features, _draft_features,
                                            heads_features, host_features)}

        def curve_at(prefix: str, name: str) -> Curve:
            part = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
            if not part:  # a target-only profile has no draft curves
                return None
            return Curve.from_state(name, tuple(str(a) for a in part["axes"]), features[str(part["features"])], part)

        for attr in cls._CURVES:
            setattr(model, attr, curve_at(f"{attr}/", attr.replace("_", "/", 1)))
        names = [str(n) for n in state["drafters"]] if "drafters" in state else []
        model.drafters = {name: curve_at(f"drafter:{name}/", name) for name in names}
        model.drafter = DRAFT_MODEL
        model.sampling = str(state["sampling"])
        model.samplers = {}
        for name in (str(n) for n in state["samplers"]):
            part = {key[len(f"sampler:{name}/"):]: value for key, value in state.items()
                    if key.startswith(f"sampler:{name}/")}
            model.samplers[name] = Curve.from_state(f"verify/{name}", VERIFY_AXES, verify_features, part)
        return model

    def with_sampling(self, sampling: str) -> "CostModel":
        """This model with verification priced for ``sampling`` (a profile's ``verify / <mode>`` points);
        KeyError where the profile prices neither it nor it as its own."""
        if sampling == self.sampling:
            return self
        model = copy.copy(self)
        model.verify, model.sampling = self.samplers[sampling], sampling
        return model

    def with_drafter(self, drafter: "Drafter | dict | None") -> "CostModel":
        """This model pricing ``drafter``'s drafting (the module docstring); the same model for a draft model."""
        drafter = Drafter.of(drafter)
        if drafter == self.drafter:
            return self
        if drafter.kind is not DrafterKind.MODEL and self.drafter_curve(drafter) is None:
            raise KeyError(drafter.curve)
        model = copy.copy(self)
        model.drafter = drafter
        return model

    def drafter_curve(self, drafter: "Drafter") -> Curve | None:
        """The curve of a drafter's passes (a head's, Medusa's, a host proposer's); None if not measured."""
        phase = "propose" if drafter.kind is DrafterKind.HOST else "decode"
        return self.drafters.get(f"{phase}/{drafter.curve}")

    def priced_drafters(self) -> list[str]:
        """The profile's drafters this model can price: ``draft`` (the draft model) and any other's curve."""
        return ["draft"] + sorted({name.split("/", 1)[1] for name in self.drafters})

    def without_overlap(self) -> "CostModel":
        """This model with the engine's work added to every step rather than overlapping it (a run
        without asynchronous scheduling: the v0 scheduler, or ``--no-async-scheduling``)."""
        if not self.overlapped:
            return self
        model = copy.copy(self)
        model.overlapped = False
        return model

    # Vectorised, exact evaluation (used to build tables, by policies and by tests).
    def with_overhead(self, passes, overhead: float) -> np.ndarray:
        """A step's time from its passes' time and the engine's own work per step (module docstring):
        their sum, or with overlapping (asynchronous) scheduling the longer of the two."""
        passes = np.asarray(passes, dtype=float) + self.exposed_overhead
        return np.maximum(passes, overhead) if self.overlapped else passes + overhead

    def decode_pass_times(self, batch_size, k, context_tokens) -> np.ndarray:
        """The passes of a decode step: the drafting at k (a draft model: k passes), the target over
        q(k) = k + 1 tokens (a tree: its tokens down to depth k), verification of q(k) - 1."""
        b, k, c = (np.asarray(v, dtype=float) for v in (batch_size, k, context_tokens))
        q = self.target_tokens(k)  # in k's own shape: each curve then evaluates a point once (Curve.__call__)
        target = self.decode_target(batch_size=b, query_tokens=q, context_tokens=c)
        verify = self.verify(batch_size=b, query_tokens=q - 1)
        return self.drafting_times(b, k, c) + target + verify

    def target_tokens(self, k) -> np.ndarray:
        """Query tokens per sequence of the target's pass at k: k + 1, or a tree's tokens down to depth k."""
        k = np.asarray(k, dtype=float)
        tree = self.drafter.tree_tokens
        if not tree:
            return k + 1
        return np.asarray(tree, dtype=float)[np.clip(k.astype(int), 0, len(tree) - 1)]

    def drafting_times(self, batch_size, k, context_tokens) -> np.ndarray:
        """What drafting k tokens per sequence costs a step (the module docstring's per-method terms)."""
        b, k, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (batch_size, k, context_tokens)))
        d = self.drafter
        if d.kind is DrafterKind.MODEL:  # a target-only profile has no draft: k is 0 there
            return k * (self.draft_times(b, 1, c) if self.decode_draft is not None else 0.0)
        curve = self.drafter_curve(d)
        drafting = k > 0
        one = np.maximum(k, 1.0)
        if d.kind is DrafterKind.HEAD:
            first = curve(batch_size=b, query_tokens=one + 1, context_tokens=c)
            rest = curve(batch_size=b, query_tokens=np.full_like(k, d.width), context_tokens=c)
            return np.where(drafting, first + (one - 1) * rest, 0.0)
        if d.kind is DrafterKind.HEADS:
            return np.where(drafting, curve(batch_size=b, query_tokens=one), 0.0)
        return np.where(drafting, curve(batch_size=b, query_tokens=one, context_tokens=c), 0.0)

    def step_times(self, batch_size, k, context_tokens, padded_batch=None, with_draft: bool = True) -> np.ndarray:
        """A decode step; ``padded_batch``: the rows its passes run on (a CUDA graph's padded size)."""
        passes = self.decode_pass_times(batch_size, k, context_tokens)
        if padded_batch is not None:
            passes = passes + self.padding_times(batch_size, k, padded_batch, with_draft)
        return self.with_overhead(passes, self.decode_overhead_at(batch_size))

    def decode_overhead_at(self, batch_size):
        """The engine's own work in a decode step of ``batch_size`` running rows: t_overhead, plus its
        per-row part where the profile measured one (the padded rows of a graph are not the engine's)."""
        if not self.decode_overhead_per_row:
            return self.decode_overhead
        return self.decode_overhead + self.decode_overhead_per_row * np.asarray(batch_size, dtype=float)

    def padding_times(self, batch_size, k, padded_batch, with_draft: bool) -> np.ndarray:
        """What running a decode step on ``padded_batch`` rows instead of ``batch_size`` adds: the padded
        rows run the linear layers and nothing else (no context, no attention), which is what they add
        to a one-prompt prefill pass, P(b' (k + 1)) - P(b (k + 1)) (the module docstring's P)."""
        b, k, bp = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (batch_size, k, padded_batch)))
        per = self.target_tokens(k)
        return self.chunk_costs(bp * per, with_draft) - self.chunk_costs(b * per, with_draft)

    def draft_times(self, batch_size, query_tokens, context_tokens) -> np.ndarray:
        """One draft pass over q tokens per sequence (q > 1: its first pass of a step, catching up).

        A profile that timed the draft at q = 1 only scales that by the target's measured
        q-dependence, t_target(b, q, c) / t_target(b, 1, c): the same kind of pass on the same device.
        """
        b, q, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (batch_size, query_tokens, context_tokens)))
        if self.draft_measures_q:
            return self.decode_draft(batch_size=b, query_tokens=q, context_tokens=c)
        at_one = self.decode_draft(batch_size=b, context_tokens=c)
        ratio = (self.decode_target(batch_size=b, query_tokens=q, context_tokens=c)
                 / self.decode_target(batch_size=b, query_tokens=np.ones_like(q), context_tokens=c))
        return at_one * np.where(q > 1, ratio, 1.0)

    def catch_up_times(self, batch_size, lag, context_tokens) -> np.ndarray:
        """What a step's first draft pass costs beyond q = 1 when the draft lags ``lag`` tokens behind.

        The draft has not seen the newest emitted token (lag 1, the normal case), plus the
        last draft token after a fully accepted step (lag 2), plus one per k = 0 step since.
        A head's first pass takes lag - 1 more tokens beside the verified ones (priced as a first
        pass of 1 + lag tokens less one of 2); Medusa and host proposers keep no KV to catch up.
        """
        lag = np.maximum(np.asarray(lag, dtype=float), 1.0)
        d = self.drafter
        if d.kind is DrafterKind.MODEL:
            return self.draft_times(batch_size, lag, context_tokens) - self.draft_times(batch_size, 1, context_tokens)
        b, lag, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (batch_size, lag, context_tokens)))
        if d.kind is not DrafterKind.HEAD:
            return np.zeros(b.shape)
        curve = self.drafter_curve(d)
        return np.where(lag > 1, curve(batch_size=b, query_tokens=1 + lag, context_tokens=c)
                        - curve(batch_size=b, query_tokens=np.full_like(lag, 2.0), context_tokens=c), 0.0)

    def step_time(self, batch_size: int, k: int, context_tokens: float) -> float:
        return float(self.step_times(batch_size, k, context_tokens))

    def prefill_pass_times(self, batch_size, prompt_tokens, with_draft: bool) -> np.ndarray:
        """The prompts' passes: the target's, and when the run speculates the drafter's (a draft model's
        prefill, a head's pass over the prompt; Medusa and host proposers have none)."""
        t = self.prefill_target(batch_size=batch_size, query_tokens=prompt_tokens)
        if with_draft:
            d = self.drafter
            if d.kind is DrafterKind.MODEL:
                t = t + self.prefill_draft(batch_size=batch_size, query_tokens=prompt_tokens)
            elif d.kind is DrafterKind.HEAD and f"prefill/{d.curve}" in self.drafters:
                t = t + self.drafters[f"prefill/{d.curve}"](batch_size=batch_size, query_tokens=prompt_tokens)
        return t

    def prefill_times(self, batch_size, prompt_tokens, with_draft: bool) -> np.ndarray:
        return self.with_overhead(self.prefill_pass_times(batch_size, prompt_tokens, with_draft),
                                  self.prefill_overhead)

    def range_warnings(self, max_batch: int, k_max: int, max_context: int, max_prompt: int,
                       with_draft: bool, drafter: "Drafter | dict | None" = None) -> list[str]:
        """Say where a run can go well beyond the measured grid (and so rely on the fitted extrapolation).

        Within FAR_BEYOND of the grid's edge the fit's ratio to the edge value is close to
        1 and not worth a warning; values below the grid's bottom are never costly enough.
        """
        if drafter is not None and Drafter.of(drafter) != self.drafter:
            return self.with_drafter(drafter).range_warnings(max_batch, k_max, max_context, max_prompt, with_draft)
        reach = {"batch_size": max_batch, "context_tokens": max_context}
        checks = [(self.decode_target, {**reach, "query_tokens": int(self.target_tokens(k_max))}),
                  (self.prefill_target, {"batch_size": max_batch, "query_tokens": max_prompt})]
        if k_max > 0 and self.drafter.kind is DrafterKind.MODEL:
            checks.append((self.decode_draft, reach))
            if with_draft:
                checks.append((self.prefill_draft, {"batch_size": max_batch, "query_tokens": max_prompt}))
        elif k_max > 0 and self.drafter.kind in (DrafterKind.HEAD, DrafterKind.HOST):
            checks.append((self.drafter_curve(self.drafter), {**reach, "query_tokens": k_max + 1
                                                              if self.drafter.kind is DrafterKind.HEAD else k_max}))
        out = []
        for curve, wanted in checks:
            for axis, value in wanted.items():
                top = curve.bounds(axis)[1]
                if value > top * FAR_BEYOND:
                    out.append(f"{curve.name}: {axis} up to {value} is beyond the measured {int(top)}; "
                               f"extrapolating with the fitted roofline model ({value / top:.1f}x the grid)")
        return out

    def chunk_costs(self, tokens, with_draft: bool) -> np.ndarray:
        """P(x) of the module docstring: a one-prompt prefill of x tokens without the engine's
        per-step overhead (x < 1 is taken as 1)."""
        x = np.maximum(np.asarray(tokens, dtype=float), 1.0)
        return self.prefill_pass_times(1, x, with_draft)

    def kv_read_cost(self, max_batch: int) -> float:
        """kappa of the module docstring: seconds per token of KV cache one more token of context
        costs a target decode pass, at the largest batch a run reaches (a full GPU's rate),
        over the curve's measured context range."""
        b = float(max(1, min(max_batch, self.decode_target.bounds("batch_size")[1])))
        low, high = self.decode_target.bounds("context_tokens")
        if high <= low:
            return 0.0
        t = self.decode_target(batch_size=b, query_tokens=1.0, context_tokens=np.array([low, high]))
        return max(0.0, float(t[1] - t[0]) / (b * (high - low)))

    @property
    def attention_coefficient(self) -> float:
        """theta of the module docstring: the prefill curve's fitted causal-attention term (t ~ theta p^2)."""
        return float(self.prefill_target.theta_compute[1])

    def prefix_attention(self, chunk_tokens, prefix_tokens, max_batch: int) -> np.ndarray:
        """X(Q, S): the chunks' attention to the S tokens their requests already hold in the KV cache."""
        q, s = (np.asarray(v, dtype=float) for v in (chunk_tokens, prefix_tokens))
        return np.maximum(self.kv_read_cost(max_batch) * s, 2.0 * self.attention_coefficient * q * s)

    def mixed_times(self, batch_size, k, context_tokens, chunk_tokens, with_draft: bool, prefix_tokens=0.0,
                    graph_sizes: tuple[int, ...] = (), max_batch: int | None = None) -> np.ndarray:
        """A vllm-v1 step's time, exactly (the module docstring's formula; lag 1). ``graph_sizes``: the
        CUDA-graph capture sizes steps are padded to (none: no padding); ``max_batch``: the batch kappa
        is read at (default: the step's)."""
        b, k, c, q, s = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (
            batch_size, k, context_tokens, chunk_tokens, prefix_tokens)))
        d = b * (k + 1)
        pad = np.vectorize(lambda tokens: float(padded_tokens(tokens, graph_sizes)), otypes=[float])
        decode = self.step_times(np.maximum(b, 1), k, c, np.maximum(pad(d) / (k + 1), 1), with_draft)
        prefix = self.prefix_attention(q, s, int(max_batch or max(1, int(b.max(initial=1)))))
        with_decodes = decode + self.chunk_costs(pad(d + q), with_draft) - self.chunk_costs(pad(d), with_draft)
        alone = self.with_overhead(self.chunk_costs(pad(q), with_draft) + prefix, self.prefill_overhead)
        return np.where(b > 0, np.where(q > 0, with_decodes + prefix, decode), alone)

    def tabulate(self, max_batch: int, k_max: int, max_context: int, max_prompt: int,
                 with_draft: bool, chunk_tokens: int = 0, graph_sizes: tuple[int, ...] | None = None,
                 drafter: "Drafter | dict | None" = None, graph_batch_sizes: tuple[int, ...] = ()) -> "StepTable":
        """``chunk_tokens``: a vllm-v1 step's token budget; P(x) is then tabulated up to it.
        ``graph_sizes``: the CUDA-graph capture sizes steps are padded to, in tokens; None: vLLM V1's
        defaults (:func:`cuda_graph_sizes`) for a vllm-v1 table of a CUDA profile, no padding otherwise.
        ``graph_batch_sizes``: capture sizes in sequences instead, as vLLM V0 pads a decode batch
        (:func:`v0_graph_batch_sizes`; a v0 table's, and the real replay's). ``drafter``: the speculation
        method's (default: the draft model's; a tree's verified tokens per k set the graph sizes' largest step)."""
        if drafter is not None and Drafter.of(drafter) != self.drafter:
            return self.with_drafter(drafter).tabulate(max_batch, k_max, max_context, max_prompt, with_draft,
                                                       chunk_tokens, graph_sizes, graph_batch_sizes=graph_batch_sizes)
        k = np.arange(k_max + 1, dtype=float)[None, :, None]
        per = self.target_tokens(k)  # tokens per sequence a step verifies: k + 1, or a tree's
        widest = int(per.max())
        if graph_sizes is None:
            graph_sizes = cuda_graph_sizes(max_batch, widest - 1, chunk_tokens) if chunk_tokens and self.cuda_graphs \
                else ()
        graph_sizes = tuple(int(g) for g in graph_sizes)
        ctx_step, prompt_step = column_widths(max_context, max_prompt)
        b = np.arange(max_batch + 1, dtype=float)[:, None, None]
        c = (np.arange(TABLE_COLUMNS + 2) * ctx_step).astype(float)[None, None, :]
        pad = np.array([padded_tokens(t, graph_sizes) for t in range((max_batch + 1) * widest)], dtype=float)
        padded = np.maximum(pad[(b * per).astype(int)] / per, 1.0)
        if graph_batch_sizes:  # whole sequences padded, whatever their tokens (vLLM V0)
            rows = np.array([padded_tokens(r, tuple(graph_batch_sizes)) for r in range(max_batch + 1)], dtype=float)
            padded = np.maximum(rows[b.astype(int)], 1.0)
        decode = self.step_times(np.maximum(b, 1), k, c, padded if graph_sizes or graph_batch_sizes else None,
                                 with_draft)
        decode[0] = 0.0
        bp = np.arange(max_batch + 1, dtype=float)[:, None]
        p = (np.arange(TABLE_COLUMNS + 2) * prompt_step).astype(float)[None, :]
        prefill = self.prefill_times(np.maximum(bp, 1), p, with_draft)
        prefill[0] = 0.0
        lags = np.arange(CATCH_UP_LAGS + 1, dtype=float)[None, :, None]
        catch_up = self.catch_up_times(np.maximum(b, 1), lags, c) if with_draft and k_max > 0 else \
            np.zeros((max_batch + 1, CATCH_UP_LAGS + 1, c.shape[-1]))
        catch_up[0] = 0.0
        after_full = decode + catch_up[:, 2:3, :]
        chunk_step = max(1, math.ceil(chunk_tokens / TABLE_COLUMNS))
        chunk = {"chunk": self.chunk_costs(np.arange(TABLE_COLUMNS + 2) * chunk_step, with_draft),
                 "graph_pad": np.array([padded_tokens(t, graph_sizes) for t in range(max(graph_sizes, default=0) + 1)],
                                       dtype=np.int64)} if chunk_tokens else {}
        return StepTable.from_arrays({"chunk_step": float(chunk_step), "decode": decode, "prefill": prefill, "context_step": float(ctx_step),
                                      "prompt_step": float(prompt_step), "max_batch": max_batch, "k_max": k_max,
                                      "catch_up": catch_up, "decode_lag2": after_full,
                                      "prefill_overhead": self.prefill_overhead,
                                      "exposed_overhead": self.exposed_overhead, "overlapped": self.overlapped,
                                      "kv_read_cost": self.kv_read_cost(max_batch),
                                      "attention_coefficient": self.attention_coefficient, **chunk,
                                      **({"drafter_kind": self.drafter.kind} if self.drafter.kind is not DrafterKind.MODEL else {})})


def column_widths(max_context: int, max_prompt: int) -> tuple[int, int]:
    """The tokens a step table's context and prompt columns are apart: the table is a function of these,
    not of the longest context and prompt themselves (runs whose longest request differs a little share it)."""
    return max(1, math.ceil(max_context / TABLE_COLUMNS)), max(1, math.ceil(max_prompt / TABLE_COLUMNS))


def cuda_graph_sizes(max_num_seqs: int, k: int = 0, max_num_batched_tokens: int | None = None) -> tuple[int, ...]:
    """vLLM V1's default CUDA-graph capture sizes, in tokens per step (vllm/config/vllm.py,
    ``_set_cudagraph_sizes``): 1, 2, 4, then every 8 below 256, then every 16, up to
    min(2 x max_num_seqs x (1 + speculative tokens), 512, max_num_batched_tokens). A step of
    more tokens than the largest runs without a graph (eager), unpadded."""
    top = min(2 * max_num_seqs * (1 + k), 512)
    if max_num_batched_tokens:
        top = min(top, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return tuple(sizes)


def v0_graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """vLLM V0's CUDA-graph batch sizes, in sequences (vllm/config.py, ``_BATCH_SIZES_TO_CAPTURE``):
    1, 2, 4, then every 8 up to 256, as far as the first one that holds ``max_num_seqs``. A decode
    batch of b sequences runs the graph of the next size up, its padded rows empty."""
    sizes = [1, 2, 4] + list(range(8, 257, 8))
    top = next((s for s in sizes if s >= max_num_seqs), sizes[-1])
    return tuple(s for s in sizes if s <= top)


def graphed(meta: dict) -> bool:
    """Whether a profile prices passes run from CUDA graphs: a CUDA device, and not calibrated eagerly
    (``--no-cuda-graphs``: its sidecar lists no graphed phase; a composed profile names none and
    sums the kernels a graphed engine runs)."""
    if meta.get("device", {}).get("type") != "cuda":
        return False
    phases = meta.get("timing", {}).get("cuda_graphs")
    return phases is None or len(phases) > 0


def padded_tokens(tokens: int, graph_sizes: tuple[int, ...]) -> int:
    """The tokens a step of ``tokens`` runs at: the next capture size up, or itself past the largest."""
    if not graph_sizes or tokens <= 0 or tokens > graph_sizes[-1]:
        return int(tokens)
    return int(graph_sizes[bisect.bisect_left(graph_sizes, tokens)])


class Rows(dict):
    """A table's rows by batch size, each made a (nested) list on first use: a scalar look-up in a
    list is several times faster than in an array, but the whole table as lists would take ~50 MB
    (a boxed float per entry) where most runs visit a few batch sizes, and compiled decode runs
    read the array itself (:attr:`array`)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        super().__init__()
        self.array = array

    def __missing__(self, batch_size: int) -> list:
        row = self[batch_size] = self.array[batch_size].tolist()
        return row


@dataclass(frozen=True)
class StepTable:
    """Pre-tabulated step costs, indexed ``[b][...]`` (:class:`Rows`: lists, made per batch size on use)."""

    decode: Rows  # [b][k][context column]
    prefill: Rows  # [b][prompt column]
    context_step: float
    prompt_step: float
    max_batch: int
    k_max: int
    catch_up: Rows  # [b][lag][context column]: extra cost of the draft's first pass
    decode_lag2: Rows  # [b][k][context column]: decode plus the catch-up at lag 2, the common case
    chunk: list | None = None  # [token column]: P(x), for vllm-v1 prefill chunks (module docstring)
    chunk_step: float = 1.0  # tokens per column of ``chunk``
    prefill_overhead: float = 0.0  # the engine's own work in a step of chunks alone
    exposed_overhead: float = 0.0  # per-step time no overlap hides
    overlapped: bool = False  # the engine's work overlaps the passes (max) rather than adding to them
    kv_read_cost: float = 0.0  # kappa: seconds per token of a chunk's cached prefix read
    attention_coefficient: float = 0.0  # theta: a chunk's Q tokens after S cached ones attend for 2 theta Q S
    graph_pad: list | None = None  # [tokens] -> the CUDA-graph size a step of that many tokens runs at
    drafter_kind: DrafterKind = DrafterKind.MODEL  # whose drafting the table prices (sim.speculation.methods)

    def decode_time(self, batch_size: int, k: int, mean_context: float) -> float:
        return _blend(self.decode[batch_size][k], mean_context / self.context_step)

    step_time = decode_time  # what policies.CostModelLike asks for

    def decode_time_lag2(self, batch_size: int, k: int, mean_context: float) -> float:
        """A step after one that accepted every draft of some sequence (the draft lags 2 tokens)."""
        return _blend(self.decode_lag2[batch_size][k], mean_context / self.context_step)

    def decode_time_at_lag(self, batch_size: int, k: int, mean_context: float, lag: int) -> float:
        """A decode step at k >= 1 whose draft lags at most ``lag`` tokens it has not seen: 1 normally
        (the newest token), 2 after a fully accepted step (one look-up), more after k = 0 steps."""
        return decode_price(self.decode, self.decode_lag2, self.catch_up, batch_size, k,
                            mean_context / self.context_step, lag)

    def decode_time_by_tokens(self, batch_size: int, ks, mean_context: float) -> float:
        """A ragged step of a host matcher's rows priced by their tokens (costmodel_rules.tokens_price)."""
        return tokens_price(self.decode, batch_size, ks, len(ks), mean_context / self.context_step)

    def catch_up_time(self, batch_size: int, lag: int, mean_context: float) -> float:
        """Beyond the tabulated lags (a long run of k = 0 steps) the cost grows linearly in lag."""
        return catch_up_price(self.catch_up[batch_size], lag, mean_context / self.context_step)

    def prefill_time(self, batch_size: int, mean_prompt: float) -> float:
        return _blend(self.prefill[batch_size], mean_prompt / self.prompt_step)

    _TABLES = ("decode", "prefill", "catch_up", "decode_lag2")

    def arrays(self) -> dict[str, np.ndarray]:
        """The table as named arrays (what :mod:`sim.costmodel.cache` stores); :meth:`from_arrays` reads them back.
        A vllm-v1 table's ``chunk`` row is stored with it; a v0 table has none (and stores none)."""
        out = {name: getattr(self, name).array for name in self._TABLES}
        out.update(context_step=np.float64(self.context_step), prompt_step=np.float64(self.prompt_step),
                   max_batch=np.int64(self.max_batch), k_max=np.int64(self.k_max),
                   chunk_step=np.float64(self.chunk_step), prefill_overhead=np.float64(self.prefill_overhead),
                   exposed_overhead=np.float64(self.exposed_overhead), overlapped=np.bool_(self.overlapped),
                   kv_read_cost=np.float64(self.kv_read_cost),
                   attention_coefficient=np.float64(self.attention_coefficient))
        if self.chunk is not None:
            out["chunk"] = np.asarray(self.chunk, dtype=np.float64)
        if self.graph_pad is not None:
            out["graph_pad"] = np.asarray(self.graph_pad, dtype=np.int64)
        if self.drafter_kind is not DrafterKind.MODEL:
            out["drafter_kind"] = np.array(self.drafter_kind)
        return out

    @classmethod
    def from_arrays(cls, arrays) -> "StepTable":
        chunk, pad = arrays.get("chunk"), arrays.get("graph_pad")
        return cls(**{name: Rows(np.ascontiguousarray(arrays[name], dtype=np.float64)) for name in cls._TABLES},
                   context_step=float(arrays["context_step"]), prompt_step=float(arrays["prompt_step"]),
                   max_batch=int(arrays["max_batch"]), k_max=int(arrays["k_max"]),
                   chunk=None if chunk is None else np.asarray(chunk, dtype=np.float64).tolist(),
                   chunk_step=float(arrays["chunk_step"]), prefill_overhead=float(arrays["prefill_overhead"]),
                   exposed_overhead=float(arrays.get("exposed_overhead", 0.0)),
                   overlapped=bool(arrays.get("overlapped", False)),
                   kv_read_cost=float(arrays.get("kv_read_cost", 0.0)),
                   attention_coefficient=float(arrays.get("attention_coefficient", 0.0)),
                   graph_pad=None if pad is None else np.asarray(pad, dtype=np.int64).tolist(),
                   drafter_kind=DrafterKind(str(arrays.get("drafter_kind", "model"))))

    def padded(self, tokens: int) -> int:
        """The tokens a step of ``tokens`` runs at (the next CUDA-graph size; itself past the largest)."""
        return padded_step(self.graph_pad or (), tokens)

    def chunk_time(self, decode_tokens: int, chunk_tokens: int, prefix_tokens: float = 0.0) -> float:
        """What a step's prefill chunks add: P(D + Q) - P(D) + X(Q, S), or for a step of chunks alone
        (D = 0) P(Q) + X(Q, S) with the engine's work per step (module docstring); one chunk of Q
        tokens after S (``prefix_tokens``) its request already holds in the KV cache (computed by
        earlier chunks or found by prefix caching); S = 0 leaves X out."""
        return self.chunks_time(decode_tokens, (chunk_tokens,), (prefix_tokens,))

    def chunks_time(self, decode_tokens: int, tokens, prefixes) -> float:
        """:meth:`chunk_time` for several chunks: ``tokens[i]`` new tokens after ``prefixes[i]`` cached ones."""
        prefix_cost = prefix_attention_price(self.kv_read_cost, self.attention_coefficient, tokens, prefixes,
                                             len(tokens))
        return chunk_price(self.chunk, self.chunk_step, self.prefill_overhead, self.exposed_overhead, self.overlapped,
                           self.graph_pad or (), decode_tokens, sum(tokens), prefix_cost)

def _draft_features(x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return decode_features({**x, "query_tokens": np.ones_like(x["batch_size"])})


def heads_features(x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Medusa's heads (no context): their weights (memory), rows of linear work (compute)."""
    b, q = x["batch_size"], x["query_tokens"]
    return np.stack([np.ones_like(b, dtype=float), q], axis=-1), (b * q)[..., None]


def host_features(x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A host proposer's time: a fixed cost, per sequence, and its scan of each context (one term per
    component, the max taken: a coarse extrapolation that stays linear in batch and context)."""
    b, q, c = x["batch_size"], x["query_tokens"], x["context_tokens"]
    return np.stack([np.ones_like(b, dtype=float), b, b * c], axis=-1), (b * q)[..., None]


VERIFY_AXES = ("batch_size", "query_tokens")


def sampler_curves(profile: Profile) -> dict[str, Curve]:
    """The profile's verification at each sampling it prices besides its own (``verify / <mode>``)."""
    from sim.costmodel.profile import SAMPLERS

    curves = {}
    for mode in SAMPLERS:
        points = profile.phase("verify", mode)
        if len(points):
            curves[mode] = Curve.from_points(f"verify/{mode}", points, VERIFY_AXES, verify_features)
    return curves


def drafter_curves(profile: Profile) -> dict[str, Curve]:
    """The profile's drafters besides the draft model, as curves keyed ``phase/model`` (sim.costmodel.profile)."""
    from sim.costmodel.profile import HEADS, HOSTS

    passes = ("batch_size", "query_tokens", "context_tokens")
    kinds = [*(("decode", name, passes, decode_features) for name in HEADS),
             *(("prefill", name, ("batch_size", "query_tokens"), prefill_features) for name in HEADS),
             ("decode", "medusa", ("batch_size", "query_tokens"), heads_features),
             *(("propose", name, passes, host_features) for name in HOSTS)]
    curves: dict[str, Curve] = {}
    for phase, name, axes, features in kinds:
        points = profile.phase(phase, name)
        if len(points):
            curves[f"{phase}/{name}"] = Curve.from_points(f"{phase}/{name}", points, axes, features)
    return curves
