"""A step backend that plays back a real replay's steps: the scheduling logic checked alone.

The real replay (``calibrate.replay``) and the simulator run the same
:class:`sim.serving.loop.ServingLoop`; only the step backend and the clock differ. Fed
what the replay measured (each step's time and each row's accepted draft tokens), the
simulator must then take exactly the replay's decisions (admissions, k, acceptance) at
exactly its times; any gap in the per-request timeline is a bug in the loop, the clock
or the replay, not a cost-model error (``specbatch validate``'s logic check).

Time is played back *absolutely*: step i ends at ``until_s[i]``, the instant the
replay's loop next read its clock (the step's end plus the loop's own work after it:
applying the step, the next schedule's release), so the simulated clock cannot drift
and the queue is released at the replay's instants. A step that followed an idle spell
starts, in simulated time, at the arrival that woke the replica (the replay wakes a
little later: its ``sleep`` overshoots), and is charged from there; the requests it admits
are those the replay found on waking (:meth:`RecordedBackend.watch`), which an overshoot
past the next arrival makes more than one.

Each step is checked against the record (phase, batch, k) before it is played: the first
difference is a :class:`LogicDivergence` naming the step.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np

from sim.serving.records import DECODE, PREFILL


class LogicDivergence(RuntimeError):
    """The simulation took a different decision than the replay at step ``step``."""

    def __init__(self, step: int, what: str) -> None:
        super().__init__(step, what)  # SimPy re-raises an exception from a process as type(e)(*e.args)
        self.step, self.what = step, what

    def __str__(self) -> str:
        return f"step {self.step}: {self.what}"


@dataclass(frozen=True)
class RecordedSteps:
    """A replay's steps, as the playback needs them (arrays indexed by step)."""

    phase: np.ndarray  # PREFILL or DECODE
    batch: np.ndarray  # prefill: prompts admitted; decode: rows running
    k: np.ndarray  # the step's k (a ragged step: its largest)
    until_s: np.ndarray  # when the replay's loop next read its clock after the step
    idle_before: np.ndarray  # the replay went idle (slept for an arrival) just before this step
    accepted: tuple  # per step: accepted draft tokens per running row (None: prefill or k = 0)
    start_s: np.ndarray | None = None  # the replay's reading each step started at (after idling: its wake-up)

    @classmethod
    def from_replay(cls, steps, readings: np.ndarray, accepted) -> RecordedSteps:
        """From a replay's step records (columns of :data:`sim.serving.records.STEP_DTYPE`), every
        clock reading its loop took (ascending) and the accepted counts per decode step."""
        phase = np.asarray(steps["phase"], np.int64)
        start, end = np.asarray(steps["start_s"], float), np.asarray(steps["end_s"], float)
        batch = np.where(phase == PREFILL, np.asarray(steps["batch_size"]), np.asarray(steps["running"]))
        # Every step's end is one of the readings; the one after it is the loop's next look at the clock.
        after = np.searchsorted(readings, end, side="left") + 1
        until = np.where(after < readings.size, readings[np.minimum(after, readings.size - 1)], end)
        # A step right after the previous one starts at the reading that followed it; otherwise
        # the loop read its clock, found nothing to do and slept in between.
        previous = np.concatenate(([readings[0] if readings.size else 0.0], until[:-1]))
        idle_before = start != previous
        return cls(phase, batch.astype(np.int64), np.asarray(steps["k"], np.int64), until, idle_before,
                   tuple(accepted), start)

    def __len__(self) -> int:
        return self.phase.shape[0]


class RecordedBackend:
    """Plays ``steps`` back in order (one per replica; :class:`sim.serving.loop.StepBackend`)."""

    follows_rows = False
    steps_compiled = False  # its times are the recorded ones, step by step

    def __init__(self, steps: RecordedSteps) -> None:
        self.steps = steps
        self.played = 0
        self.now = 0.0  # the simulated time the current step starts at

    def watch(self, queue) -> None:
        """Release ``queue`` as the replay did: before a step that followed an idle spell, up to
        the replay's wake-up reading. The replay's ``sleep`` can overshoot past the next
        arrival, and it then admitted every request that had arrived by the time it woke."""
        release, steps = queue.release, self.steps

        def release_as_replayed(now: float) -> None:
            i = self.played
            if i < len(steps) and steps.idle_before[i] and steps.start_s is not None:
                due = queue.next_arrival_s()
                if due is not None and due <= now:  # waking for an arrival (not the release after a step)
                    now = max(now, float(steps.start_s[i]))
            release(now)

        queue.release = release_as_replayed

    def _next(self, phase: int, batch: int, k: int) -> int:
        i, steps = self.played, self.steps
        if i >= len(steps):
            raise LogicDivergence(i, f"the simulation runs a step more than the replay's {len(steps)}")
        recorded = (int(steps.phase[i]), int(steps.batch[i]), int(steps.k[i]))
        if recorded != (phase, batch, k):
            raise LogicDivergence(i, f"the simulation runs {_step(phase, batch, k)}, the replay ran "
                                     f"{_step(*recorded)}")
        self.played = i + 1
        return i

    def _charge(self, i: int, start: float) -> float:
        until = float(self.steps.until_s[i])
        self.now = until
        if until <= start:
            return 0.0
        dt = until - start
        for _ in range(64):  # the clock adds dt to start: land on the recorded instant exactly
            if start + dt == until:
                break
            dt = math.nextafter(dt, math.inf if start + dt < until else -math.inf)
        return dt

    def run(self, plan) -> tuple[float, np.ndarray | None]:
        """The recorded duration of the step the plan must match (else :class:`LogicDivergence`)."""
        if plan.chunks:
            raise RuntimeError("a replay's steps are v0 steps: no prefill chunks to play back")
        if plan.prefill:
            n = plan.prefill_count
            i = self._next(PREFILL, n, 0)
            # After an idle spell the simulated replica wakes at the arrival of the queue's head.
            start = float(plan.queue.arrival_s[plan.prefill_head]) if self.steps.idle_before[i] else self.now
            return self._charge(i, max(start, self.now)), None
        k, running = plan.k, plan.rows
        i = self._next(DECODE, running, k)
        accepted = self.steps.accepted[i]
        if k and (accepted is None or accepted.shape != (running,)):
            raise LogicDivergence(i, "the replay recorded no accepted count per running row for this step")
        return self._charge(i, self.now), (accepted if k else None)

    def commit(self) -> None:
        """Nothing to write: the step was only played back."""

    def retire(self, done: np.ndarray) -> None:
        """No per-row state of its own."""

    def check_done(self) -> None:
        """The simulation must have played every recorded step."""
        if self.played != len(self.steps):
            raise LogicDivergence(self.played, f"the simulation ended after {self.played} steps, the replay ran "
                                               f"{len(self.steps)}")


def _step(phase: int, batch: int, k: int) -> str:
    return f"a prefill of {batch} prompts" if phase == PREFILL else f"a decode of {batch} rows at k = {k}"
