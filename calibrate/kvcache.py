"""A preallocated KV cache with per-sequence lengths, as a serving engine keeps one.

Speculative decoding appends k+1 tokens per sequence and then throws away the rejected
draft tokens, a different number per sequence; :meth:`KVCache.rollback` does that by
moving lengths back (stale entries past a length are masked out, never read).

Besides the device tensor ``lengths`` the cache keeps a host-side int ``span``: an upper
bound of every length, so attention reads only ``[:span]`` keys (cost grows with the
context actually used, not with the allocation) without a device->host sync. All
updates are plain tensor ops, so a forward pass plus a rollback can be captured in a
CUDA graph and replayed.
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer keys/values of shape ``[batch, max_len, kv_heads, head_dim]``: token-major, as vLLM's
    flash-attention cache, so one layer's rows are one ``[batch * max_len, kv_heads, head_dim]`` buffer
    that a variable-length kernel reads row by row, each to its own length (calibrate.attention.attend)."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 *, dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (num_layers, batch, max_len, kv_heads, head_dim)
        # zeros, not empty: uninitialised memory may hold NaNs or denormals that slow CPU math
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.span = 0
        self.max_len = max_len

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch: int, max_len: int) -> "KVCache":
        cfg = model.cfg
        return cls(cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim,
                   dtype=model.dtype, device=model.device)

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    def fill(self, length: int) -> None:
        """Pretend every sequence already holds ``length`` tokens (contents are irrelevant to timing)."""
        self.check_room(length)
        self.lengths.fill_(length)
        self.span = length

    def fill_lengths(self, lengths: list[int]) -> None:
        """Pretend sequence i holds ``lengths[i]`` tokens: a served batch's rows differ (ragged_lengths)."""
        if len(lengths) != self.batch:
            raise ValueError(f"{len(lengths)} lengths for a cache of {self.batch} sequences")
        self.check_room(max(lengths))
        self.lengths.copy_(torch.as_tensor(lengths, dtype=torch.long))
        self.span = max(lengths)

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, positions: torch.Tensor) -> None:
        """Store ``[b, kv_heads, q, d]`` keys/values at absolute ``positions [b, q]`` of each sequence."""
        rows = torch.arange(self.batch, device=positions.device)[:, None]
        self.k[layer][rows, positions] = k_new.transpose(1, 2)
        self.v[layer][rows, positions] = v_new.transpose(1, 2)

    def advance(self, q: int) -> None:
        """Count ``q`` freshly written tokens in every sequence."""
        self.check_room(self.span + q)
        self.lengths.add_(q)
        self.span += q

    def append(self, layer_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write ``q`` new tokens for every layer at the current lengths and advance (no model needed)."""
        q = layer_kv[0][0].shape[2]
        self.check_room(self.span + q)
        positions = self.lengths[:, None] + torch.arange(q, device=self.lengths.device)
        for layer, (k_new, v_new) in enumerate(layer_kv):
            self.write(layer, k_new, v_new, positions)
        self.advance(q)

    def rows(self, lo: int, hi: int, span: int) -> "KVCache":
        """Sequences ``lo..hi-1`` as a cache of their own: a view, so what passes write lands here.

        ``span`` must bound those sequences' lengths (the caller tracks lengths on the host,
        so no device sync is needed). The real replay runs each step on the rows in use.
        """
        view = object.__new__(KVCache)
        view.k, view.v, view.lengths = self.k[:, lo:hi], self.v[:, lo:hi], self.lengths[lo:hi]
        view.span, view.max_len = span, self.max_len
        return view

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy sequence ``src``'s first ``length`` entries into row ``dst`` (a finished row's slot)."""
        self.k[:, dst, :length] = self.k[:, src, :length]
        self.v[:, dst, :length] = self.v[:, src, :length]
        self.lengths[dst] = self.lengths[src]

    def rollback(self, n: int | torch.Tensor, *, known: bool = False) -> None:
        """Forget the last ``n`` tokens: an int for every sequence, or a LongTensor ``[batch]`` each.

        ``known``: the caller tracks lengths on the host and knows ``0 <= n <= length`` (the real
        replay), so nothing is read back from the device, which would wait for its queued work;
        ``span`` then stays what it was, still an upper bound of every length.
        """
        if isinstance(n, torch.Tensor):
            n = n.to(device=self.lengths.device, dtype=torch.long)
            if known:
                self.lengths.sub_(n)
                return
            if bool((n < 0).any()) or bool((n > self.lengths).any()):
                raise ValueError("rollback count must lie in [0, length] for every sequence")
            self.lengths.sub_(n)
            self.span = int(self.lengths.max()) if self.batch else 0
            return
        if n < 0 or n > self.span:
            raise ValueError(f"cannot roll back {n} tokens from a cache of span {self.span}")
        self.lengths.sub_(n)  # a device op with no sync, so it can live inside a CUDA graph
        self.span -= n

    def check_room(self, length: int) -> None:
        if length > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} tokens per sequence; {length} requested")


def ragged_lengths(rows: int, mean: int, *, cap: int | None = None) -> list[int]:
    """``rows`` contexts whose mean is ``mean``, spread evenly from about a quarter of it to 1.75 times it
    (pairs around the mean, so the mean is exact; none above ``cap``), as a served batch's rows differ.

    Why: a split-context attention kernel gives each row its own blocks, so a batch waits for its
    longest row; rows all at the mean time a kernel no served batch runs."""
    reach = 0.75 * mean if cap is None else min(0.75 * mean, max(cap - mean, 0))
    half = [round(reach * (i + 1) / (rows // 2)) for i in range(rows // 2)]
    lengths = [mean + d for d in half] + [mean - d for d in half] + ([mean] if rows % 2 else [])
    return sorted(max(length, 1) for length in lengths)
