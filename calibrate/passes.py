"""What exactly is timed at each grid point: one closure per point, repeatable.

* prefill: one forward over ``prompt`` tokens per sequence into an empty cache, logits
  of the last position only (what an engine samples from);
* decode/draft: one draft step: forward over q tokens (1, or more when catching up) at ``ctx`` cached tokens, then
  softmax and sampling of the next draft token (both sit on the draft loop's critical path);
* decode/target: one forward over q tokens per sequence at ``ctx`` cached tokens, logits
  for all q positions (k = q - 1 drafts plus the bonus position);
* verify: softmax of the target logits ``[b, k+1, V]`` and rejection sampling against the
  draft probabilities (k = 0: sampling one token);
* decode/<head> (EAGLE, EAGLE-3, MTP; calibrate.heads): one head pass over q tokens at ``ctx``
  cached ones, fed random hidden states (q >= 2: a step's first pass), and the greedy draft's
  argmax; prefill/<head>: its pass over a prompt; decode/medusa: k heads on the last hidden state.

Each closure rolls the cache back after its forward pass, so repeats (and CUDA graph
replays) all run at the same context length. With ``ragged`` (``--ragged-contexts``) a decode
point's rows hold contexts spread around ``ctx`` (calibrate.kvcache.ragged_lengths) instead of
all holding ``ctx``: the mean is the point's, the longest row is what a split kernel waits for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from calibrate.grid import Point
from calibrate.kvcache import ragged_lengths
from calibrate.model import Transformer
from calibrate.verify import sample, verify_logits

GRAPHABLE = {("decode", "draft"), ("decode", "target"), ("decode", "eagle"), ("decode", "eagle3"), ("decode", "mtp"),
             ("decode", "medusa"), ("verify", "target"),
             ("prefill", "target"), ("prefill", "draft")}  # as the real replay runs them (calibrate.graphs)


@dataclass
class Pass:
    fn: Callable[[], object]
    graphable: bool


def build_pass(point: Point, models: dict[str, Transformer], generator: torch.Generator, *,
               ragged: bool = False) -> Pass:
    """The timed closure for ``point`` with its inputs already allocated on the device."""
    model = models[point.model]
    device, vocab = model.device, model.cfg.vocab_size
    b, q, ctx = point.batch_size, point.query_tokens, point.context_tokens
    graphable = (point.phase, point.model) in GRAPHABLE
    if point.model not in ("target", "draft"):
        return _head_pass(point, model, generator, graphable, ragged)

    if point.phase == "verify":
        k = q
        logits = torch.randn(b, k + 1, vocab, generator=generator, device=device).to(model.dtype)
        draft_probs = torch.softmax(torch.randn(b, k, vocab, generator=generator, device=device), dim=-1)
        draft_tokens = sample(draft_probs, generator) if k else torch.empty(b, 0, dtype=torch.long, device=device)
        return Pass(lambda: verify_logits(logits, draft_probs, draft_tokens), graphable)  # default generator: graph-safe

    tokens = torch.randint(0, vocab, (b, q), generator=generator, device=device)
    cache = _filled_cache(model, b, q, ctx, ragged and point.phase == "decode")

    if point.phase == "prefill":
        def prefill() -> torch.Tensor:
            out = model(tokens, cache, last_only=True)
            cache.rollback(q)
            return out
        return Pass(prefill, graphable)

    if point.model == "draft":
        def draft_step() -> torch.Tensor:
            logits = model(tokens, cache)
            cache.rollback(q)
            return sample(torch.softmax(logits[:, -1].float(), dim=-1))  # default generator: graph-safe
        return Pass(draft_step, graphable)

    def target_pass() -> torch.Tensor:
        out = model(tokens, cache)
        cache.rollback(q)
        return out
    return Pass(target_pass, graphable)


def _filled_cache(model, b: int, q: int, ctx: int, ragged: bool):
    """A cache of ``b`` rows holding ``ctx`` tokens each, or ragged rows of mean ``ctx``, with room for ``q`` more."""
    if not ragged:
        cache = model.new_cache(b, ctx + q)
        cache.fill(ctx)
        return cache
    lengths = ragged_lengths(b, ctx, cap=model.cfg.max_position_embeddings - q)
    cache = model.new_cache(b, max(lengths) + q)
    cache.fill_lengths(lengths)
    return cache


def _head_pass(point: Point, head, generator: torch.Generator, graphable: bool, ragged: bool = False) -> Pass:
    """A drafter head's timed pass (the module docstring), inputs allocated up front."""
    device, dtype = head.device, head.dtype
    b, q, ctx = point.batch_size, point.query_tokens, point.context_tokens
    if point.model == "medusa":
        hidden = torch.randn(b, 1, head.cfg.hidden_size, generator=generator, device=device).to(dtype)
        return Pass(lambda: head.medusa(hidden, q), graphable)
    first = point.phase == "prefill" or q >= 2
    tokens = torch.randint(0, head.embed.shape[0], (b, q), generator=generator, device=device)
    hidden = torch.randn(b, q, head.hidden_width(first), generator=generator, device=device).to(dtype)
    cache = _filled_cache(head, b, q, ctx, ragged and point.phase == "decode")

    def head_pass() -> torch.Tensor:
        logits = head(tokens, hidden, cache, first=first)
        cache.rollback(q)
        return logits.argmax(dim=-1)
    return Pass(head_pass, graphable)
