"""The search: coordinate descent over the cells, successive halving over seeds in each cell.

Why this search and not a grid or a Bayesian optimiser: 8 bands x k 0-7 is 8^8 = 16.7
million schedules, so a grid is out; and the objective has structure that a black-box
optimiser (TPE, a Gaussian process) cannot see:

* a band acts only while the batch is in it, so the objective is nearly separable across
  bands and one band's best k moves little when another band changes: coordinate
  descent's case;
* a band the batch never reaches cannot change a run at all: changing its k gives the
  same bytes, which one run per seed proves (a *probe*), so the search skips it exactly
  instead of spending a budget on it;
* candidates run on the same seeds share their workload (common random numbers), so two
  schedules are compared by paired differences, sharp enough that one seed sorts out the
  clearly worse k values; successive halving spends the further seeds only on the few
  that remain.

A pass examines every cell against the same incumbent, all cells in lock-step so that each
round is one batch for the executor (one process pool serves every batch; a Dask cluster, per batch):

1. *Probes.* Each cell's neighbouring k (one up, or one down at the top) runs on every
   search seed. On a seed where a probe gives the incumbent's result exactly, its cell was
   never consulted, so every k there that keeps the schedule's largest k (which sizes the
   KV reserve and whether a draft is loaded) gives that result too and is not run; a cell
   never consulted on any seed is skipped.
2. *Successive halving* in each remaining cell over its other k values: all on the first
   seed, the best 1/eta on the next, and so on; one batch per seed for all cells together.
3. *Moves.* A cell's survivor improves on the incumbent when it is better over all search
   seeds beyond the noise: a one-sided paired t-test over the seeds at 5%, divided by the
   number of candidates it was picked from (the best of seven looks better than it is;
   Bonferroni). Moves within noise would only make the schedule ragged and fit the search
   seeds' luck. With several improving cells, the schedule with all their moves runs too
   and is taken if it improves (tested the same way) and beats the best single move;
   otherwise the best single move is taken.

Passes repeat until one finds no improving move (or ``max_passes``). The start is the best
uniform schedule (every fixed k) or the analytic ``lut`` projected onto the bands, chosen
by successive halving too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from specbatch.commands.tune.objective import NOISE_LEVEL, Objective, paired
from specbatch.commands.tune.space import Schedule, Space
from specbatch.commands.tune.trials import same_run

# (schedule, seed) pairs -> their summaries, in order; ``phase`` names the step for the trials table.
RunBatch = Callable[[Sequence[tuple[Schedule, int]], str], list[dict]]

ETA = 3           # successive halving keeps the best 1/ETA after each seed
MAX_PASSES = 4


@dataclass(frozen=True)
class Move:
    cell: int
    old_k: int
    new_k: int
    loss_before: float
    loss_after: float
    runs: int          # runs the search had used when it moved


@dataclass
class SearchResult:
    best: Schedule
    loss: float                          # mean loss over the search seeds
    start: Schedule
    moves: list[Move]
    passes: int
    runs: int                            # (schedule, seed) runs the search simulated
    inferred: int                        # runs it knew without simulating (a cell never consulted on that seed)
    skipped: int                         # cells skipped, summed over the passes: never consulted on any seed
    history: list[tuple[int, float]] = field(default_factory=list)  # (runs so far, incumbent's loss)


class CoordinateSearch:
    def __init__(self, space: Space, objective: Objective, run: RunBatch, seeds: Sequence[int], *, eta: int = ETA,
                 max_passes: int = MAX_PASSES, say: Callable[[str], None] | None = None) -> None:
        if eta < 2:
            raise ValueError("successive halving needs eta >= 2")
        self.space, self.objective, self.run_batch = space, objective, run
        self.seeds, self.eta, self.max_passes = tuple(seeds), eta, max_passes
        self.say = say or (lambda text: None)
        self.summaries: dict[tuple[Schedule, int], dict] = {}
        self.ran = 0
        self.inferred = 0
        self.skipped = 0
        self.rivals: dict[int, int] = {}  # cell -> candidates its last halving picked from

    # ------------------------------------------------------------------ runs and losses

    def ensure(self, pairs: Sequence[tuple[Schedule, int]], phase: str) -> None:
        todo = list(dict.fromkeys(p for p in pairs if p not in self.summaries))
        if todo:
            for pair, summary in zip(todo, self.run_batch(todo, phase)):
                self.summaries[pair] = summary
            self.ran += len(todo)

    def losses(self, schedule: Schedule, seeds: Sequence[int] | None = None) -> list[float]:
        return [self.objective.loss(self.summaries[(schedule, s)]) for s in (self.seeds if seeds is None else seeds)]

    def loss(self, schedule: Schedule, seeds: Sequence[int] | None = None) -> float:
        """Mean loss over the seeds (all search seeds by default); every pair must be known."""
        values = self.losses(schedule, seeds)
        return math.fsum(values) / len(values)

    def improves(self, candidate: Schedule, incumbent: Schedule, rivals: int = 1) -> bool:
        """Better on the search seeds beyond the noise: a one-sided paired t-test at 5% / ``rivals``
        (the candidates it was picked from: the best of several looks better than it is)."""
        return paired(self.losses(candidate), self.losses(incumbent)).below(NOISE_LEVEL / rivals)

    # ------------------------------------------------------------------ successive halving

    def halving(self, groups: dict[Hashable, Sequence[Schedule]], phase: str) -> dict[Hashable, Schedule]:
        """The best schedule of each group: all on the first seed, the best 1/eta on the next, ...; the
        groups advance in lock-step (one batch per seed); ties go to the earlier schedule."""
        alive = {g: list(dict.fromkeys(pool)) for g, pool in groups.items()}
        for r, seed in enumerate(self.seeds):
            self.ensure([(s, seed) for pool in alive.values() for s in pool], phase)
            if r == len(self.seeds) - 1:
                break
            done = self.seeds[:r + 1]
            for g, pool in alive.items():
                ranked = sorted(range(len(pool)), key=lambda i: (self.loss(pool[i], done), i))
                alive[g] = [pool[i] for i in ranked[:max(1, math.ceil(len(pool) / self.eta))]]
        self.ensure([(s, seed) for pool in alive.values() for s in pool for seed in self.seeds], phase)
        return {g: min(pool, key=lambda s: (self.loss(s), pool.index(s))) for g, pool in alive.items()}

    # ------------------------------------------------------------------ one pass

    def examine(self, incumbent: Schedule, label: str) -> dict[int, Schedule]:
        """Each reached cell's best schedule (differing from the incumbent in that cell only)."""
        values = self.space.k_values
        if len(values) < 2:
            return {}
        probes = {}
        for cell in range(self.space.size):
            higher = [k for k in values if k > incumbent[cell]]
            probes[cell] = _with(incumbent, cell, higher[0] if higher else max(k for k in values if k < incumbent[cell]))
        self.ensure([(p, s) for p in probes.values() for s in self.seeds], f"{label}: probes")
        groups = {}
        for cell, probe in probes.items():
            unconsulted = [s for s in self.seeds
                           if same_run(self.summaries[(probe, s)], self.summaries[(incumbent, s)])]
            if len(unconsulted) == len(self.seeds):
                self.skipped += 1
                continue  # never consulted on any search seed: no k of this cell can act
            candidates = [probe] + [_with(incumbent, cell, k) for k in values if k not in (incumbent[cell], probe[cell])]
            # Where the cell was never consulted, a candidate with the incumbent's (or the probe's) largest
            # k gives exactly that run: it is known without simulating it.
            for candidate in candidates[1:]:
                for seed in unconsulted:
                    known = next((x for x in (incumbent, probe) if max(x) == max(candidate)), None)
                    if known is not None and (candidate, seed) not in self.summaries:
                        self.summaries[(candidate, seed)] = self.summaries[(known, seed)]
                        self.inferred += 1
            groups[cell] = candidates
        self.rivals = {cell: len(candidates) for cell, candidates in groups.items()}
        return self.halving(groups, f"{label}: halving")

    # ------------------------------------------------------------------ the whole search

    def search(self, starts: Sequence[Schedule]) -> SearchResult:
        incumbent = self.halving({"start": starts}, "start")["start"]
        start = incumbent
        history = [(self.ran, self.loss(incumbent))]
        self.say(f"start: {self.space.text(incumbent)} ({self.objective.metric} {self._shown(incumbent)})")
        moves: list[Move] = []
        passes = 0
        while passes < self.max_passes:
            passes += 1
            label = f"pass {passes}"
            winners = self.examine(incumbent, label)
            improving = {cell: s for cell, s in winners.items() if self.improves(s, incumbent, self.rivals[cell])}
            if not improving:
                self.say(f"{label}: no cell improves by more than the noise; done")
                break
            best_single = min(improving.values(), key=lambda s: (self.loss(s), s))
            chosen = best_single
            if len(improving) > 1:
                combined = tuple(improving[c][c] if c in improving else k for c, k in enumerate(incumbent))
                self.ensure([(combined, s) for s in self.seeds], f"{label}: combined")
                if self.improves(combined, incumbent, sum(self.rivals.values())) and \
                        self.loss(combined) <= self.loss(best_single):
                    chosen = combined
            moves += [Move(c, incumbent[c], chosen[c], self.loss(incumbent), self.loss(chosen), self.ran)
                      for c in range(self.space.size) if chosen[c] != incumbent[c]]
            self.say(f"{label}: " + ", ".join(f"{self.space.cell_text(c)} k {incumbent[c]} -> {chosen[c]}"
                                             for c in range(self.space.size) if chosen[c] != incumbent[c])
                     + f"; {self.objective.metric} {self._shown(incumbent)} -> {self._shown(chosen)}")
            incumbent = chosen
            history.append((self.ran, self.loss(incumbent)))
        if history[-1][0] != self.ran:  # the last pass's runs, which found nothing
            history.append((self.ran, self.loss(incumbent)))
        return SearchResult(incumbent, self.loss(incumbent), start, moves, passes, self.ran, self.inferred,
                            self.skipped, history)

    def _shown(self, schedule: Schedule) -> str:
        return f"{self.objective.value(self.loss(schedule)):.6g}"


def _with(schedule: Schedule, cell: int, k: int) -> Schedule:
    return schedule[:cell] + (k,) + schedule[cell + 1:]
