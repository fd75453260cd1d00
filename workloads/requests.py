"""The request table every workload produces and the engine consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Requests:
    """Requests as columns, sorted by arrival time (seconds from the start of the run)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    alpha: np.ndarray | None = None  # per-request acceptance in (0, 1); NaN where not given
    label: np.ndarray | None = None  # per-request dataset name (object array of str)
    # Prefix caching (sim/scheduler/kvcache.py): requests with the same prompt_id send the same prompt;
    # requests with the same prefix_id share their first prefix_tokens tokens (a system prompt). -1: none.
    prompt_id: np.ndarray | None = None
    prefix_id: np.ndarray | None = None
    prefix_tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        arrival = np.ascontiguousarray(self.arrival_s, dtype=np.float64)
        prompt = np.ascontiguousarray(self.prompt_tokens, dtype=np.int64)
        output = np.ascontiguousarray(self.output_tokens, dtype=np.int64)
        if not (arrival.shape == prompt.shape == output.shape) or arrival.ndim != 1:
            raise ValueError("arrival_s, prompt_tokens and output_tokens must be 1-D arrays of one length")
        if arrival.size and (arrival[0] < 0 or np.any(np.diff(arrival) < 0)):
            raise ValueError("arrival times must be non-negative and sorted")
        if np.any(prompt < 1) or np.any(output < 1):
            raise ValueError("every request needs at least one prompt token and one output token")
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "prompt_tokens", prompt)
        object.__setattr__(self, "output_tokens", output)
        if self.alpha is not None:
            alpha = np.ascontiguousarray(self.alpha, dtype=np.float64)
            if alpha.shape != arrival.shape:
                raise ValueError("alpha must have one value per request")
            given = alpha[~np.isnan(alpha)]
            if np.any((given <= 0) | (given >= 1)):
                raise ValueError("per-request alpha must be inside (0, 1) (NaN: not given)")
            object.__setattr__(self, "alpha", alpha)
        for name in ("prompt_id", "prefix_id", "prefix_tokens"):
            value = getattr(self, name)
            if value is not None:
                value = np.ascontiguousarray(value, dtype=np.int64)
                if value.shape != arrival.shape:
                    raise ValueError(f"{name} must have one value per request")
                object.__setattr__(self, name, value)
        if (self.prefix_id is None) != (self.prefix_tokens is None):
            raise ValueError("prefix_id and prefix_tokens come together")
        if self.prefix_id is not None:
            shared = self.prefix_id >= 0
            if np.any(self.prefix_tokens[shared] < 0) or np.any(self.prefix_tokens[shared] > prompt[shared]):
                raise ValueError("a shared prefix (prefix_tokens) must be within its request's prompt")
        if self.label is not None:
            label = np.asarray(self.label, dtype=object)
            if label.shape != arrival.shape:
                raise ValueError("label must have one value per request")
            object.__setattr__(self, "label", np.array([str(x) for x in label], dtype=object))

    def __len__(self) -> int:
        return int(self.arrival_s.size)
