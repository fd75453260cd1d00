"""The measurement grid: which (phase, model, batch, query tokens, context) points to time.

Points per phase (``query_tokens`` / ``context_tokens`` as :mod:`sim.costmodel.profile` defines them):

* prefill, target and draft: batch x prompt length (batch x prompt capped by
  ``max_prefill_tokens``, as an engine caps the tokens of one prefill batch);
* decode, draft: batch x q x context, q = 1 (a draft step) .. DRAFT_CATCH_UP (its first pass
  of a step when it lags behind: the last draft token of a fully accepted step, or tokens
  emitted by k = 0 steps; the simulator extrapolates beyond);
* decode, target: batch x q x context, q = 1 (plain decode) .. k_max + 1 (verify pass);
* verify (the rejection sampler over the target vocabulary): batch x k = 0 .. k_max;
* drafters besides the draft model (``drafters``, docs/speculation-methods.md): a head's (EAGLE,
  EAGLE-3, MTP) decode passes of q = 1 .. k_max + 1 tokens over the contexts and its prefill over
  the prompts; Medusa's heads, 1 .. k_max of them, in one pass; a host proposer's (n-gram,
  suffix) look-ups at k = 1 and k_max over the batches and contexts (phase ``propose``).

Defaults differ per device: the CPU grid finishes in about ten minutes for
tinyllama-1.1b / llama-68m on two cores (prefill is capped at 1024 tokens per batch there:
one such pass already takes ~15 s); the CUDA grid spans serving-sized batches and contexts
up to the model pair's maximum length (powers of two, plus the longest context that still
leaves room for k_max + 1 query tokens). This module imports no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sim.errors import InputError

CUDA_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
CPU_BATCHES = (1, 2, 4, 8, 16, 32)
DRAFT_CATCH_UP = 3  # largest draft q measured (capped by the target's largest q)


@dataclass(frozen=True, order=True)
class Point:
    phase: str
    model: str
    batch_size: int
    query_tokens: int
    context_tokens: int

    @property
    def key(self) -> tuple[str, str, int, int, int]:
        return (self.phase, self.model, self.batch_size, self.query_tokens, self.context_tokens)

    def label(self) -> str:
        what = {"prefill": f"prompt {self.query_tokens}", "verify": f"k {self.query_tokens}"}.get(
            self.phase, f"q {self.query_tokens} ctx {self.context_tokens}")
        return f"{self.phase}/{self.model} b {self.batch_size} {what}"


@dataclass(frozen=True)
class Grid:
    batch_sizes: tuple[int, ...]
    query_tokens: tuple[int, ...]  # target decode q; k_max = max - 1
    contexts: tuple[int, ...]
    prompts: tuple[int, ...]
    max_prefill_tokens: int
    warmup: int
    repeats: int
    budget_s: float  # per point: stop repeating once samples add up to this

    @property
    def k_max(self) -> int:
        return max(self.query_tokens) - 1

    @property
    def draft_query_tokens(self) -> tuple[int, ...]:
        return tuple(q for q in self.query_tokens if q <= DRAFT_CATCH_UP) or (1,)

    def points(self, drafters: tuple[str, ...] = ()) -> list[Point]:
        """Every point in measuring order: prefill, draft decode, target decode, verify, then the drafters'."""
        pts = [Point("prefill", model, b, p, 0) for model in ("target", "draft") for p in self.prompts
               for b in self.batch_sizes if b * p <= self.max_prefill_tokens]
        pts += [Point("decode", "draft", b, q, c) for c in self.contexts for q in self.draft_query_tokens
                for b in self.batch_sizes]
        pts += [Point("decode", "target", b, q, c) for c in self.contexts for q in self.query_tokens
                for b in self.batch_sizes]
        pts += [Point("verify", "target", b, k, 0) for k in range(self.k_max + 1) for b in self.batch_sizes]
        return pts + [Point(*key) for key in drafter_points(self, drafters)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["k_max"] = self.k_max
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


HEAD_DRAFTERS = ("eagle", "eagle3", "mtp", "medusa")
HOST_DRAFTERS = ("ngram", "suffix")
DRAFTERS = HEAD_DRAFTERS + HOST_DRAFTERS


def drafter_points(grid: Grid, drafters) -> list[tuple[str, str, int, int, int]]:
    """The drafters' points (the module docstring), as (phase, model, batch, q, context) keys."""
    out = []
    for method in drafters:
        if method == "medusa":
            out += [("decode", "medusa", b, k, 0) for k in range(1, grid.k_max + 1) for b in grid.batch_sizes]
        elif method in HOST_DRAFTERS:
            out += [("propose", method, b, k, c) for c in grid.contexts for k in sorted({1, max(1, grid.k_max)})
                    for b in grid.batch_sizes]
        else:
            out += [("prefill", method, b, p, 0) for p in grid.prompts for b in grid.batch_sizes
                    if b * p <= grid.max_prefill_tokens]
            out += [("decode", method, b, q, c) for c in grid.contexts for q in grid.query_tokens
                    for b in grid.batch_sizes]
    return out


def drafter_list(text: str) -> list[str]:
    """``eagle,eagle3,ngram``: drafters besides the draft model (a CLI list), each once, in a fixed order."""
    import argparse

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in DRAFTERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"'{bad[0] if bad else text}' is not one of {', '.join(DRAFTERS)}")
    return [d for d in DRAFTERS if d in names]


def default_grid(device: str, max_len: int = 2048, **overrides: Any) -> Grid:
    """Per-device defaults; ``max_len`` is the longest sequence both models accept.

    ``overrides`` replace fields (``None`` values are ignored); ``k_max`` sets q = 1..k_max+1.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    k_max = overrides.pop("k_max", None)
    if device == "cuda":
        q_max = 9 if k_max is None else k_max + 1
        base: dict[str, Any] = dict(
            batch_sizes=CUDA_BATCHES, query_tokens=tuple(range(1, q_max + 1)),
            contexts=_powers_of_two(128, max_len - q_max, include_top=True), prompts=_powers_of_two(128, min(4096, max_len)),
            max_prefill_tokens=32768, warmup=3, repeats=20, budget_s=5.0)
    else:
        q_max = 8 if k_max is None else k_max + 1
        base = dict(
            batch_sizes=CPU_BATCHES, query_tokens=tuple(range(1, q_max + 1)),
            contexts=tuple(c for c in (128, 512, 1024) if c + q_max <= max_len) or (max_len - q_max,),
            prompts=tuple(p for p in (32, 128, 512) if p <= max_len),
            max_prefill_tokens=1024, warmup=1, repeats=3, budget_s=1.0)
    if k_max is not None and "query_tokens" in overrides:
        raise InputError("give either query tokens or k_max, not both", field="k_max")
    base.update(overrides)
    grid = Grid(**{k: tuple(sorted(set(v))) if isinstance(v, (list, tuple)) else v for k, v in base.items()})
    check_grid(grid, max_len)
    return grid


def check_grid(grid: Grid, max_len: int) -> None:
    """Every value in range; one :class:`InputError` naming the field otherwise."""
    for field in ("batch_sizes", "query_tokens", "contexts", "prompts"):
        values = getattr(grid, field)
        if not values:
            raise InputError("needs at least one value", field=field)
        if min(values) < 1:
            raise InputError(f"values must be at least 1 (got {min(values)})", field=field)
    if grid.max_prefill_tokens < 1:
        raise InputError("must be at least 1", field="max_prefill_tokens")
    if max(grid.contexts) + max(grid.query_tokens) > max_len:
        raise InputError(f"context {max(grid.contexts)} + {max(grid.query_tokens)} query tokens exceeds the "
                         f"models' maximum length {max_len}", field="contexts")
    if max(grid.prompts) > max_len:
        raise InputError(f"prompt {max(grid.prompts)} exceeds the models' maximum length {max_len}", field="prompts")
    if grid.warmup < 0 or grid.repeats < 1:
        raise InputError("need warmup >= 0 and repeats >= 1", field="repeats" if grid.repeats < 1 else "warmup")
    if not grid.budget_s > 0:
        raise InputError("must be positive", field="budget_s")


def _powers_of_two(lo: int, hi: int, *, include_top: bool = False) -> tuple[int, ...]:
    """lo, 2 lo, 4 lo, ... <= hi; with ``include_top`` also hi itself (the longest that fits)."""
    values, v = [], lo
    while v <= hi:
        values.append(v)
        v *= 2
    if include_top and hi >= 1 and (not values or values[-1] != hi):
        values.append(hi)
    return tuple(values) or (hi,)
