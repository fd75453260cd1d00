"""What a tune searches: one speculation length k per batch-size band (optionally per context band).

A **schedule** is a tuple of k, one per *cell*: a batch-size band, or a batch-size band in a
context band (cells ordered context band first, then batch band). The simulator runs it as
the ``lut`` policy (batch bands only) or the ``context`` policy (with context bands), the
table's adjacent bands of equal k merged; the same table is what ``--format`` writes for
vLLM, SGLang and TensorRT-LLM (the engine policies' own ``engine_config``), so a pasted
config reproduces the tuned runs.

Bands are inclusive batch-size ranges that cover 1..max_batch. ``--bands N`` places N of
them where a run of the analytic ``lut`` spends its decode steps (:func:`fitted_bands`): a
band the batch never reaches is a band wasted, and the lut's own switch points are where
k is known to matter; ``--bands 4,16,64`` gives the upper edges instead. Context bands are
upper edges in tokens; the last band holds every longer context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from sim.errors import InputError
from sim.limits import MAX_TOKENS

Schedule = tuple[int, ...]
FORMATS = ("lut", "vllm", "sglang", "trtllm")
SGLANG_MIN_K = 1  # SGLang never drafts zero steps (docs/policy-engines.md)


def batch_bands(edges: Sequence[int] | str, max_batch: int, source: str = "--bands") -> tuple[tuple[int, int], ...]:
    """Inclusive batch-size bands covering 1..max_batch from their upper edges (the last runs to max_batch)."""
    edges = _edges(edges, source, "batch sizes")
    if edges[-1] > max_batch:
        raise InputError(f"edge {edges[-1]} is above the engine's max batch size {max_batch}", source=source)
    if edges[-1] < max_batch:
        edges.append(max_batch)  # the last band runs up to the largest batch the engine forms
    return tuple(zip([1] + [edge + 1 for edge in edges[:-1]], edges))


def fitted_bands(steps: Sequence[int], switches: Sequence[int], count: int) -> tuple[tuple[int, int], ...]:
    """At most ``count`` bands over 1..max_batch (``steps[b]``: decode steps at batch size b, b = 0..max_batch),
    placed where the decode steps are: first cut where the analytic lut changes k (``switches``: the
    last batch size of each of its ranges), a band without steps merged into its neighbour, then
    the two neighbouring bands with the fewest steps merged while there are too many, and the
    band with the most steps split at its median while there are too few (a band is split only
    if steps fall on both sides)."""
    if count < 1:
        raise InputError(f"must be at least 1 band, got {count}", source="--bands")
    max_batch = len(steps) - 1
    cum = [0]
    for b in range(1, max_batch + 1):
        cum.append(cum[-1] + int(steps[b]))

    def mass(band: tuple[int, int]) -> int:
        return cum[band[1]] - cum[band[0] - 1]

    edges = sorted({e for e in switches if 1 <= e < max_batch} | {max_batch})
    bands: list[tuple[int, int]] = []
    for band in zip([1] + [e + 1 for e in edges[:-1]], edges):
        if bands and (mass(band) == 0 or mass(bands[-1]) == 0):  # a band without steps is a band wasted
            bands[-1] = (bands[-1][0], band[1])
        else:
            bands.append(band)
    while len(bands) > count:
        i = min(range(len(bands) - 1), key=lambda j: (mass(bands[j]) + mass(bands[j + 1]), j))
        bands[i:i + 2] = [(bands[i][0], bands[i + 1][1])]
    while len(bands) < count:
        splits = []
        for i, (lo, hi) in enumerate(bands):
            total = mass((lo, hi))
            cuts = [b for b in range(lo, hi) if 0 < cum[b] - cum[lo - 1] < total]
            if cuts:
                cut = min(cuts, key=lambda b: (abs(2 * (cum[b] - cum[lo - 1]) - total), b))
                splits.append((-total, i, cut))
        if not splits:
            break  # every band's steps fall on one batch size: nothing left to separate
        _, i, cut = min(splits)
        lo, hi = bands[i]
        bands[i:i + 1] = [(lo, cut), (cut + 1, hi)]
    return tuple(bands)


def context_bands(spec: Sequence[int], source: str = "--context-bands") -> tuple[tuple[int, int], ...]:
    """Inclusive context-length bands from upper edges (tokens); the last band holds every longer context."""
    edges = _edges(spec, source, "context lengths")
    if edges[-1] >= MAX_TOKENS:
        raise InputError(f"edges must be below {MAX_TOKENS} tokens", source=source)
    starts = [0] + [edge + 1 for edge in edges]
    return tuple(zip(starts, [*edges, MAX_TOKENS]))


def _edges(spec: Any, source: str, what: str) -> list[int]:
    if isinstance(spec, str):
        try:
            spec = [int(part) for part in spec.split(",")]
        except ValueError:
            raise InputError(f"'{spec}' is not whole numbers separated by commas", source=source) from None
    if (not isinstance(spec, (list, tuple)) or not spec
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in spec)):
        raise InputError(f"expected upper edges ({what}), whole numbers >= 1, got {spec!r}", source=source)
    if any(b <= a for a, b in zip(spec, spec[1:])):
        raise InputError(f"edges must increase, got {list(spec)}", source=source)
    return list(spec)


@dataclass(frozen=True)
class Space:
    """The bands, the k values a band may take, and what a schedule over them means."""

    bands: tuple[tuple[int, int], ...]
    contexts: tuple[tuple[int, int], ...] | None
    k_values: tuple[int, ...]

    @property
    def size(self) -> int:
        """Cells: batch bands x context bands."""
        return len(self.bands) * len(self.contexts or (None,))

    def cell(self, index: int) -> tuple[tuple[int, int], tuple[int, int] | None]:
        """(batch band, context band or None) of a cell."""
        ctx, band = divmod(index, len(self.bands))
        return self.bands[band], None if self.contexts is None else self.contexts[ctx]

    def cell_text(self, index: int) -> str:
        (start, end), ctx = self.cell(index)
        text = f"batch {start}" if start == end else f"batch {start}-{end}"
        if ctx is not None:
            text += f", context {ctx[0]}+" if ctx[1] == MAX_TOKENS else f", context {ctx[0]}-{ctx[1]}"
        return text

    def uniform(self, k: int) -> Schedule:
        return (k,) * self.size

    def table(self, schedule: Schedule) -> list[list[int]]:
        """The policy's table: ``[[start, end, k], ...]`` (lut) or ``[[min_bs, max_bs, min_ctx, max_ctx, k], ...]``
        (context), adjacent batch bands of equal k merged."""
        rows = []
        for c, ctx in enumerate(self.contexts or (None,)):
            merged: list[list[int]] = []
            for (start, end), k in zip(self.bands, schedule[c * len(self.bands):(c + 1) * len(self.bands)]):
                if merged and merged[-1][2] == k:
                    merged[-1][1] = end
                else:
                    merged.append([start, end, k])
            rows += merged if ctx is None else [[s, e, ctx[0], ctx[1], k] for s, e, k in merged]
        return rows

    def policy(self, schedule: Schedule) -> dict[str, Any]:
        """The policy that runs the schedule, as a config's [policy] table."""
        return {"name": "lut" if self.contexts is None else "context", "table": self.table(schedule)}

    def project(self, k_at, steps: Sequence[int] | None = None) -> Schedule:
        """A schedule from a rule batch size -> k: per band, the k that most of its decode steps get
        (``steps[b]``: steps at batch size b), or, in a band without steps, most of its batch sizes;
        ties to the smaller k, clipped to the searched range."""
        ks = []
        for start, end in self.bands:
            weights = [steps[b] if steps is not None and b < len(steps) else 0 for b in range(start, end + 1)]
            if not any(weights):
                weights = [1] * (end - start + 1)
            counts: dict[int, int] = {}
            for b, weight in zip(range(start, end + 1), weights):
                k = min(max(k_at(b), self.k_values[0]), self.k_values[-1])
                counts[k] = counts.get(k, 0) + weight
            ks.append(max(sorted(counts), key=lambda k: counts[k]))
        return tuple(ks) * len(self.contexts or (None,))

    def text(self, schedule: Schedule) -> str:
        """One line: the merged rows as band:k, e.g. ``1-8:4 9-32:2 33-256:0``."""
        parts = []
        for row in self.table(schedule):
            start, end, k = row[0], row[1], row[-1]
            band = f"{start}" if start == end else f"{start}-{end}"
            if self.contexts is not None:
                band += f"@{row[2]}-{'' if row[3] == MAX_TOKENS else row[3]}"
            parts.append(f"{band}:{k}")
        return " ".join(parts)


def engine_text(space: Space, schedule: Schedule, fmt: str) -> str:
    """The schedule as the engine takes it (docs/policy-engines.md); the matching policy reads it back.

    ``lut``: a scenario's [policy] table (``lut``, or ``context`` with context bands);
    ``vllm``: speculative_config JSON; ``sglang``: the adaptive config JSON; ``trtllm``:
    draft_len_schedule. Raises InputError where the engine cannot express the schedule.
    """
    table = space.table(schedule)
    if fmt == "lut":  # as `specbatch lut --out` writes it: one line of rows (a JSON list of numbers is TOML)
        policy = space.policy(schedule)
        return f"[policy]\nname = \"{policy['name']}\"\ntable = {json.dumps(policy['table'])}"
    if space.contexts is not None:
        raise InputError(f"{fmt} takes one k per batch size; a schedule with context bands is written "
                         "only as a lut (context) table", source="--format")
    if fmt == "vllm":
        from policies.vllm_dynamic import engine_config

        return json.dumps(engine_config(table))
    if fmt == "sglang":
        from policies.sglang_adaptive import engine_config

        config, raised = engine_config(table)
        if raised:
            start, end, _ = raised[0]
            raise InputError(f"SGLang drafts at least one step, and the schedule has k = 0 at batch {start}-{end}; "
                             "tune with --format sglang to search k >= 1", source="--format")
        return json.dumps(config)
    if fmt == "trtllm":
        from policies.trtllm_schedule import engine_config, format_schedule

        return format_schedule(engine_config(table))
    raise InputError(f"'{fmt}' is not one of {', '.join(FORMATS)}", source="--format")


def engine_policy(space: Space, schedule: Schedule, fmt: str) -> dict[str, Any]:
    """The policy that reads ``engine_text`` back (a config's [policy] table)."""
    text = engine_text(space, schedule, fmt)
    if fmt == "lut":
        return space.policy(schedule)
    name, param = {"vllm": ("vllm-dynamic", "speculative_config"), "sglang": ("sglang-adaptive", "adaptive_config"),
                   "trtllm": ("trtllm-schedule", "draft_len_schedule")}[fmt]
    return {"name": name, param: text}
