"""Shared-prefix traffic, as inference-perf's ``shared_prefix`` data: groups of prompts behind a system prompt.

``groups`` x ``prompts_per_group`` distinct prompts; every prompt of a group starts with the
group's system prompt of ``system_prompt_tokens`` tokens, followed by a question of its own
(its length drawn once per prompt from the workload's prompt-length distribution). Each
request sends one of the prompts, chosen uniformly at random, so prompts are sent again and
again: with prefix caching (vllm-v1) a request finds its group's system prompt, and a prompt
sent before its whole prompt, in the cache. Written ``GROUPS:PROMPTS:SYSTEM`` on the command
line, or as a TOML table ``{ groups = G, prompts_per_group = P, system_prompt_tokens = S }``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.lengths import LengthSpec
from workloads.limits import MAX_TOKENS

FIELDS = ("groups", "prompts_per_group", "system_prompt_tokens")


@dataclass(frozen=True)
class SharedPrefix:
    groups: int
    prompts_per_group: int
    system_prompt_tokens: int

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            low = 0 if name == "system_prompt_tokens" else 1
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TOKENS:
                raise ValueError(f"{name} must be a whole number in {low}..{MAX_TOKENS}, got {value!r}")
        if self.groups * self.prompts_per_group > 10_000_000:
            raise ValueError("groups x prompts_per_group must be at most 10,000,000 prompts")

    @property
    def prompts(self) -> int:
        return self.groups * self.prompts_per_group

    def draw(self, rng: np.random.Generator, n: int, questions: LengthSpec) -> dict[str, np.ndarray]:
        """n requests' prompt lengths, prompt ids, prefix ids and shared prefix lengths."""
        question = questions.sample(rng, self.prompts)  # one length per distinct prompt
        chosen = rng.integers(0, self.prompts, size=n)
        return {"prompt_tokens": self.system_prompt_tokens + question[chosen], "prompt_id": chosen,
                "prefix_id": chosen // self.prompts_per_group,
                "prefix_tokens": np.full(n, self.system_prompt_tokens, dtype=np.int64)}

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FIELDS}


def parse_shared_prefix(raw) -> SharedPrefix:
    """``GROUPS:PROMPTS:SYSTEM`` or a table with the three fields."""
    if isinstance(raw, SharedPrefix):
        return raw
    if isinstance(raw, dict):
        unknown = set(raw) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown field {sorted(unknown)[0]!r} (fields: {', '.join(FIELDS)})")
        missing = [f for f in FIELDS if f not in raw]
        if missing:
            raise ValueError(f"missing field {missing[0]!r} (fields: {', '.join(FIELDS)})")
        return SharedPrefix(**{f: raw[f] for f in FIELDS})
    if isinstance(raw, str):
        parts = raw.split(":")
        if len(parts) != 3 or not all(p.strip().isdigit() and p.strip().isascii() for p in parts):
            raise ValueError(f"expected GROUPS:PROMPTS:SYSTEM_TOKENS such as 8:16:512, got {raw!r}")
        return SharedPrefix(*(int(p) for p in parts))
    raise ValueError(f"expected GROUPS:PROMPTS:SYSTEM_TOKENS or a table, got {raw!r}")
