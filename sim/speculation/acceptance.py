"""Acceptance models: how many draft tokens a verification step keeps (docs/acceptance.md).

* ``geometric`` (the default): each draft token is accepted with probability alpha,
  independently, until the first rejection, so a sequence keeps a = min(G, k) tokens where
  P(G >= j) = alpha^j and emits a + 1. Per-request alpha may be drawn from a Beta distribution.
* ``per-position``: P(a >= j) = rate[j - 1], the list vLLM's per-position acceptance rate
  reports (accepted at position j / drafts); past the list's end each further position keeps
  the list's last conditional rate, rate[-1] / rate[-2].
* ``trace``: each request replays one record of accepted/drafted counts per step (vLLM's
  ``per_step_accepted`` / ``per_step_drafted``), request i record i mod N, step by step
  (wrapping round when the record runs out). A step that drafted d and kept a keeps
  min(a, k) at the simulated k; when it kept everything it drafted (a = d) and k > d,
  the positions past d are drawn geometrically with the record's own acceptance rate.
* ``runlength``: each request replays one record of *run lengths* per output position (the
  proposer named by ``proposer``: ``eagle`` or ``ngram``, as SpecDecode-Bench measured them):
  with k proposed at position i, min(k, v_i - 1) are kept (:mod:`sim.speculation.proposals`); with
  ``trace_lengths`` the requests take their prompt and output lengths from the records.

A host-side proposer (n-gram, suffix) proposes only where the context matches: ``match_rate``
is the chance it matches at an output position (under ``runlength``: at a position whose run is
1, since a longer run matched), :mod:`sim.speculation.proposals`. A tree draft (SGLang's ``eagle_topk`` > 1)
also needs ``sibling_rates`` (:mod:`sim.speculation.trees`).

Sampling is vectorised and cheap per step: G = floor(E / -ln(alpha)) with E a
standard exponential, drawn ahead in large blocks from a seeded generator, so one
step costs a slice, a multiply and a clip, whatever alpha each sequence has.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.errors import InputError, missing_file

DISTRIBUTIONS = ("fixed", "beta")
MODELS = ("geometric", "per-position", "trace", "runlength")
PROPOSERS = ("eagle", "ngram")  # the run-length traces' fields (SpecDecode-Bench's measured proposers)
_EDGE = 1e-12  # keeps per-request alpha strictly inside (0, 1)


@dataclass(frozen=True)
class AcceptanceSpec:
    """alpha: mean acceptance rate of the model pair on the dataset, in (0, 1).

    distribution "fixed": every request has alpha; "beta": each request draws its
    own from Beta(alpha * concentration, (1 - alpha) * concentration).
    """

    alpha: float = 0.7
    distribution: str = "fixed"
    concentration: float = 10.0
    model: str = "geometric"                     # one of MODELS
    per_position: tuple[float, ...] | None = None  # model "per-position": P(a >= j), j = 1, 2, ...
    trace: str | None = None                     # model "trace"/"runlength": a JSONL file of per-request records
    proposer: str | None = None                  # model "runlength": which proposer's runs (PROPOSERS)
    trace_lengths: bool = False                  # model "runlength": requests take the records' lengths
    match_rate: float | None = None              # host proposers: chance the context matches (None: the method's)
    sibling_rates: tuple[float, ...] | None = None  # trees: ranks 2, 3, ...' chance given the better ranks missed

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be inside (0, 1), got {self.alpha}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}")
        if not (self.concentration > 0 and math.isfinite(self.concentration)):
            raise ValueError("concentration must be a positive number")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}")
        if self.model == "per-position" and self.per_position is None:
            raise ValueError("the per-position model needs its rates (per_position)")
        if self.model in ("trace", "runlength") and self.trace is None:
            raise ValueError(f"the {self.model} model needs a trace file (trace)")
        if self.model == "runlength" and self.proposer not in PROPOSERS:
            raise ValueError(f"the runlength model needs proposer, one of {', '.join(PROPOSERS)}")
        if self.match_rate is not None and not 0.0 <= self.match_rate <= 1.0:
            raise ValueError(f"match_rate must be in [0, 1], got {self.match_rate}")

    def request_alphas(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Each request's alpha (requests.csv's column): the per-position model's first rate;
        under a trace, the acceptance rate of the record the request replays."""
        if self.model == "per-position":
            return np.full(n, min(max(self.per_position[0], _EDGE), 1.0 - _EDGE))
        if self.model == "trace":
            trace = read_acceptance_trace(self.trace)
            return trace.record_alpha[np.arange(n) % len(trace)]
        if self.model == "runlength":
            runs = read_runlength_trace(self.trace, self.proposer)
            return runs.record_alpha[np.arange(n) % len(runs)]
        if self.distribution == "fixed":
            return np.full(n, self.alpha)
        a, b = self.alpha * self.concentration, (1.0 - self.alpha) * self.concentration
        return np.clip(rng.beta(a, b, size=n), _EDGE, 1.0 - _EDGE)


def expected_tokens_per_step(alpha: float | np.ndarray, k: int) -> float | np.ndarray:
    """E[a + 1] = (1 - alpha^(k+1)) / (1 - alpha): tokens one sequence emits per step."""
    return (1.0 - np.power(alpha, k + 1)) / (1.0 - alpha)


def acceptance_scale(alphas: np.ndarray) -> np.ndarray:
    """Per-sequence 1 / -ln(alpha), the factor that turns an exponential into G."""
    return 1.0 / -np.log(alphas)


DRAW_BLOCK = 1 << 16  # draws made at a time (any size draws the same stream: the generator's values in order)


class AcceptanceSampler:
    """Draws accepted-token counts for a batch, one step at a time.

    The draws come from a buffer refilled in blocks from the seeded generator; what a row keeps
    is :func:`sim.speculation.proposals.count_accepted` of its draw (``kind`` says how), the rule the
    compiled runs apply to the same buffer: :meth:`reserve` hands them the buffer and
    :meth:`advance` takes back how far they read, so one stream of draws serves both paths.
    """

    kind = 1  # sim.scheduler.layout.SCALED: an exponential times the row's 1 / -ln(alpha)
    keyed = False
    draws_ahead = True  # _fresh(a) then _fresh(b) gives _fresh(a + b): its next block may be drawn early
    # Its counts are count_accepted of its buffer's draws, which a compiled run applies itself; a
    # subclass with its own ``accepted`` is drawn step by step unless it says otherwise.
    draws_compiled = True
    compilable = False  # unwrapped, it keeps no tally a compiled run could add its counts to (RecordingSampler)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "accepted" in cls.__dict__ and "draws_compiled" not in cls.__dict__:
            cls.draws_compiled = False

    def __init__(self, rng: np.random.Generator, block: int | None = None) -> None:
        self._rng = rng
        self._block = block = block or DRAW_BLOCK
        self._buffer = self._fresh(block)
        self._pos = 0
        self._ahead = None  # the next block of the stream, being drawn on the side (see _next_block)
        self.rules = interpreted_rules()  # what it counts with (use_rules: its replica's)
        self.proposals = ALWAYS_PROPOSE  # how rows propose (sim.simulate sets a host matcher's)
        self.negative_rates = np.zeros(0)  # POSITIONS only

    def use_rules(self, rules) -> None:
        """Count with its replica's rules (sim.serving.loop.Rules: compiled or interpreted, sim/jit.py)."""
        self.rules = rules

    def _fresh(self, n: int, room: int = 0) -> np.ndarray:
        """The stream's next ``n`` draws, after ``room`` slots left unset (:meth:`reserve` fills them), drawn
        into the array they are handed over in, not into a temporary copied after (a million requests: the
        draws' thread's CPU 1.7 s -> 1.5 s)."""
        out = np.empty(room + n)
        self._rng.standard_exponential(out=out[room:])
        return out

    def watch(self, loop) -> None:
        """The serving loop whose rows it draws for (a sampler that reads the rows' state keeps it)."""

    def reserve(self, n: int) -> tuple[np.ndarray, int]:
        """The draw buffer and the position of the next draw, with at least ``n`` draws there
        (refilled exactly as drawing them would)."""
        if self._pos + n > self._buffer.shape[0]:
            rest = self._buffer[self._pos:]
            block, room = self._next_block(max(self._block, n), n)
            if rest.shape[0] <= room:  # the draws not yet used go in front of the block, in the room left there
                block[room - rest.shape[0]:room] = rest
                self._buffer, self._pos = block, room - rest.shape[0]
            else:
                self._buffer, self._pos = np.concatenate((rest, block[room:])), 0
        return self._buffer, self._pos

    def _next_block(self, size: int, room: int = 0) -> tuple[np.ndarray, int]:
        """The stream's next ``size`` draws, after ``room`` unused slots: (array, room). The first
        ``block`` of them were drawn on a worker thread while the run went on (the generator fills
        arrays without the GIL, and so does the compiled run): a million-request run spends most of
        a second drawing. That thread also leaves the room in front of the block, where
        :meth:`reserve` puts the draws its buffer has left, so the run's own thread copies those
        few, not the block (a million requests: about 1,500 blocks of 65,536). The order of the
        stream is kept (this block, then any more asked for, then the next block on the side), so
        the draws are those :meth:`_fresh` would give in one call."""
        if self._ahead is None:
            head = self._fresh(self._block, room)
        else:
            head, self._ahead = self._ahead.result(), None
            room = head.shape[0] - self._block
        if size > self._block:
            head = np.concatenate((head, self._fresh(size - self._block)))
        if self.draws_ahead:
            self._ahead = _draw_thread().submit(lambda: self._fresh(self._block, room))
        return head, room

    def __getstate__(self) -> dict:
        """A block being drawn on the side is waited for and kept as drawn (a future cannot be pickled)."""
        state = dict(self.__dict__)
        if state.get("_ahead") is not None:
            state["_ahead"] = _Drawn(state["_ahead"].result())
        return state

    def advance(self, position: int) -> None:
        """The next draw is at ``position`` of the buffer :meth:`reserve` handed out."""
        self._pos = position

    def accepted(self, scale: np.ndarray, k) -> np.ndarray:
        """Accepted draft tokens per sequence, each in [0, k] (k: an int, or one per sequence);
        ``scale`` from :func:`acceptance_scale`."""
        n = scale.shape[0]
        buffer, pos = self.reserve(n)
        ks = np.full(n, k, dtype=np.int64) if isinstance(k, int) else k
        out = np.empty(n, dtype=np.int64)
        shared = buffer.dtype.kind == "i"
        self.rules.count_accepted(self.kind, buffer if shared else _NO_INTS, _NO_FLOATS if shared else buffer, pos,
                                  np.ascontiguousarray(scale, dtype=np.float64), ks, n, self.negative_rates, out)
        self._pos = pos + n
        return out


_NO_INTS, _NO_FLOATS = np.zeros(0, dtype=np.int64), np.zeros(0)


@dataclass(frozen=True)
class _Drawn:
    """A block drawn already, standing where a pending one was (an unpickled sampler's)."""

    block: np.ndarray

    def result(self) -> np.ndarray:
        return self.block


@lru_cache(maxsize=1)
def _draw_thread():
    """One worker thread for every sampler's blocks drawn ahead: each sampler has one at a time, and a
    generator is only ever drawn from by one thread at a time (its block waited for before the next)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="draws")


# A process forked from one that drew ahead has the executor but not its thread: it makes its own.
os.register_at_fork(after_in_child=_draw_thread.cache_clear)


@lru_cache(maxsize=1)
def interpreted_rules():
    """The rules a sampler counts with before its replica hands it its own: the plain functions."""
    from types import SimpleNamespace

    from sim.speculation.proposals import count_accepted, runlength_accepted

    return SimpleNamespace(count_accepted=count_accepted, runlength_accepted=runlength_accepted)


class SharedAlphaSampler(AcceptanceSampler):
    """The same draws when every sequence shares one alpha, with G precomputed per block.

    Gives exactly the counts :class:`AcceptanceSampler` would for a constant scale,
    at the cost of one clip per step instead of a multiply, a clip and a cast.
    """

    kind = 0  # sim.scheduler.layout.SHARED

    def __init__(self, rng: np.random.Generator, scale: float, block: int | None = None) -> None:
        self._scale = scale
        self._drawn = np.empty(0)  # the exponentials of the block being drawn, before their cast
        super().__init__(rng, block)

    def _fresh(self, n: int, room: int = 0) -> np.ndarray:
        """As the exponentials times the scale, cast to int64 (truncated), with no temporary of a block's size:
        the exponentials go into an array the sampler keeps (its blocks are drawn one at a time)."""
        if self._drawn.shape[0] < n:
            self._drawn = np.empty(n)
        drawn = self._drawn[:n]
        self._rng.standard_exponential(out=drawn)
        drawn *= self._scale
        out = np.empty(room + n, np.int64)
        out[room:] = drawn
        return out

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_drawn": np.empty(0)}  # the scratch is remade at the next block


class PositionSampler(AcceptanceSampler):
    """The per-position model: one uniform U per sequence keeps #{j < k : rate[j] > U} drafts.

    With the rates non-increasing that set is a prefix, so P(a >= j) = rate[j - 1] exactly.
    """

    kind = 2  # sim.scheduler.layout.POSITIONS

    def __init__(self, rng: np.random.Generator, rates: np.ndarray, block: int | None = None) -> None:
        super().__init__(rng, block)
        self.negative_rates = -np.asarray(rates, dtype=float)  # ascending: a draw keeps those below it

    def _fresh(self, n: int, room: int = 0) -> np.ndarray:
        out = np.empty(room + n)
        drawn = out[room:]
        self._rng.random(out=drawn)
        np.negative(drawn, out=drawn)
        return out


def position_rates(rates: tuple[float, ...], k_max: int) -> np.ndarray:
    """P(a >= j) for j = 1..k_max: the given rates, then the last conditional rate repeated."""
    given = np.asarray(rates, dtype=float)
    if k_max <= given.size:
        return given[:max(k_max, 1)]
    ratio = given[-1] / given[-2] if given.size > 1 and given[-2] > 0 else given[-1]
    tail = given[-1] * np.power(ratio, np.arange(1, k_max - given.size + 1))
    return np.concatenate((given, tail))


def parse_rates(raw, falling: bool = True) -> tuple[float, ...]:
    """Per-position rates from a TOML list or a flag's "0.8,0.6,0.45": in [0, 1], non-increasing
    (``falling``; a tree's sibling rates need not be)."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"expected a list of rates such as {'[0.8, 0.6, 0.45]' if falling else '[0.3, 0.2]'}, "
                         f"got {raw!r}")
    try:
        rates = tuple(float(x) for x in items)
    except (TypeError, ValueError):
        raise ValueError(f"'{raw}' is not a list of numbers") from None
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"every rate must be in [0, 1], got {list(rates)}")
    if not falling:
        return rates
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"rates must not increase with position (P(a >= j) only falls), got {list(rates)}")
    if rates[0] == 0.0:
        raise ValueError("the first rate is 0: no draft would ever be accepted")
    return rates


# ------------------------------------------------------------------------------- the trace model


@dataclass(frozen=True)
class AcceptanceTrace:
    """Per-request records of accepted/drafted draft tokens per step, flattened.

    Record r's steps are ``accepted[start[r]:start[r] + length[r]]`` (and ``drafted``); a
    record without steps holds one empty step (0 of 0), so its request draws every
    position from the tail rule with the trace's overall acceptance rate.
    """

    accepted: np.ndarray
    drafted: np.ndarray
    start: np.ndarray
    length: np.ndarray
    record_alpha: np.ndarray  # the record's accepted / drafted, inside (0, 1): its tail rate

    def __len__(self) -> int:
        return int(self.start.shape[0])


def read_acceptance_trace(path: str) -> AcceptanceTrace:
    """A JSONL file, one request per line: vLLM's ``per_step_accepted`` and ``per_step_drafted``
    (at the top level of the object, or under ``metrics.speculative_decoding`` as in a vLLM
    response). Read once per file version; a bad line is an InputError naming it."""
    file = Path(path)
    if not file.is_file():
        raise InputError(missing_file(file, "acceptance trace file"), source=str(path), field="acceptance.trace")
    stat = file.stat()
    return _read_trace(str(file.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _read_trace(path: str, mtime_ns: int, size: int) -> AcceptanceTrace:
    accepted, drafted, lengths = [], [], []
    with open(path) as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            a, d = _trace_record(line, path, line_no)
            if not a:
                a, d = [0], [0]
            accepted.extend(a)
            drafted.extend(d)
            lengths.append(len(a))
    if not lengths:
        raise InputError("the acceptance trace has no records", source=path, field="acceptance.trace")
    acc, drf = np.asarray(accepted, dtype=np.int64), np.asarray(drafted, dtype=np.int64)
    length = np.asarray(lengths, dtype=np.int64)
    start = np.concatenate(([0], np.cumsum(length)[:-1]))
    overall = acc.sum() / drf.sum() if drf.sum() else 0.0
    acc_sum, drf_sum = np.add.reduceat(acc, start), np.add.reduceat(drf, start)
    with np.errstate(invalid="ignore", divide="ignore"):
        alpha = np.where(drf_sum > 0, acc_sum / np.maximum(drf_sum, 1), overall)
    return AcceptanceTrace(acc, drf, start, length, np.clip(alpha, _EDGE, 1.0 - _EDGE))


def _json_record(line: str, path: str, line_no: int):
    """A trace line's JSON value, and the error maker for that line (field acceptance.trace)."""
    def bad(message: str) -> InputError:
        return InputError(message, source=path, line=line_no, field="acceptance.trace")

    try:
        return json.loads(line), bad
    except json.JSONDecodeError as exc:
        raise bad(f"not JSON: {exc.msg}") from None


def _trace_record(line: str, path: str, line_no: int) -> tuple[list[int], list[int]]:
    record, bad = _json_record(line, path, line_no)
    if isinstance(record, dict) and "per_step_accepted" not in record:
        record = (record.get("metrics") or {}).get("speculative_decoding") or record
    if not isinstance(record, dict) or "per_step_accepted" not in record or "per_step_drafted" not in record:
        raise bad("each line needs per_step_accepted and per_step_drafted (vLLM's "
                  "--per-request-spec-decode-metrics detailed)")
    a, d = record["per_step_accepted"], record["per_step_drafted"]
    if not (isinstance(a, list) and isinstance(d, list)) or len(a) != len(d):
        raise bad("per_step_accepted and per_step_drafted must be lists of one length")
    for x, y in zip(a, d):
        if not (isinstance(x, int) and isinstance(y, int)) or isinstance(x, bool) or isinstance(y, bool):
            raise bad(f"counts must be whole numbers, got accepted {x!r} of drafted {y!r}")
        if not 0 <= x <= y:
            raise bad(f"a step accepted {x} of {y} drafted: needs 0 <= accepted <= drafted")
    return a, d


class TraceSampler(AcceptanceSampler):
    """The trace model. Keyed: a row's value is its request id, and the sampler keeps each
    request's position in its record (the module docstring has the replay rule)."""

    keyed = True

    def __init__(self, rng: np.random.Generator, trace: AcceptanceTrace, num_requests: int,
                 block: int | None = None) -> None:
        record = np.arange(num_requests) % len(trace)
        self._acc, self._drf = trace.accepted, trace.drafted
        self._start, self._length = trace.start[record], trace.length[record]
        self._tail_scale = acceptance_scale(trace.record_alpha[record])
        self._cursor = np.zeros(num_requests, dtype=np.int64)
        super().__init__(rng, block)

    def _take(self, n: int) -> np.ndarray:
        buffer, pos = self.reserve(n)
        self._pos = pos + n
        return buffer[pos:pos + n]

    def accepted(self, keys: np.ndarray, k) -> np.ndarray:
        ids = keys.astype(np.int64)
        step = self._cursor[ids]
        self._cursor[ids] = step + 1
        at = self._start[ids] + step % self._length[ids]
        kept, drafted = self._acc[at], self._drf[at]
        tail = (self._take(ids.shape[0]) * self._tail_scale[ids]).astype(np.int64)
        beyond = np.where(kept == drafted, np.minimum(tail, np.maximum(k - drafted, 0)), 0)
        return np.minimum(kept, k) + beyond


# ------------------------------------------------------------------------- the run-length model


@dataclass(frozen=True)
class RunLengthTrace:
    """Per-request run lengths per output position (one proposer's), flattened: record r's are
    ``runs[start[r]:start[r] + length[r]]``; ``length[r]`` is its output length (the source's own
    simulator takes a request's output as its runs' count), ``prompt[r]`` its prompt tokens."""

    runs: np.ndarray
    start: np.ndarray
    length: np.ndarray
    prompt: np.ndarray
    record_alpha: np.ndarray  # the share of the record's positions whose first guess is kept, inside (0, 1)

    def __len__(self) -> int:
        return int(self.start.shape[0])


def read_runlength_trace(path: str, proposer: str) -> RunLengthTrace:
    """A JSONL file (gzipped too), one request per line: ``prompt_tokens`` and, per proposer, its runs
    (``eagle``, ``ngram``: lists of whole numbers >= 1, one per output position). Read once per file
    version; a bad line is an InputError naming it."""
    file = Path(path)
    if not file.is_file():
        raise InputError("no such acceptance trace file", source=str(path), field="acceptance.trace")
    stat = file.stat()
    return _read_runs(str(file.resolve()), stat.st_mtime_ns, stat.st_size, proposer)


def _open_text(path: str):
    import gzip

    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gzipped else open(path, encoding="utf-8")


@lru_cache(maxsize=8)
def _read_runs(path: str, mtime_ns: int, size: int, proposer: str) -> RunLengthTrace:
    runs, lengths, prompts = [], [], []
    try:
        with _open_text(path) as handle:
            for line_no, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                values, prompt = _runlength_record(line, path, line_no, proposer)
                runs.extend(values)
                lengths.append(len(values))
                prompts.append(prompt)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the acceptance trace: {exc}", source=path, field="acceptance.trace") from None
    if not lengths:
        raise InputError("the acceptance trace has no records", source=path, field="acceptance.trace")
    flat = np.asarray(runs, dtype=np.int64)
    length = np.asarray(lengths, dtype=np.int64)
    start = np.concatenate(([0], np.cumsum(length)[:-1])).astype(np.int64)
    kept = np.add.reduceat((flat > 1).astype(float), start) / length
    return RunLengthTrace(flat, start, length, np.asarray(prompts, dtype=np.int64),
                          np.clip(kept, _EDGE, 1.0 - _EDGE))


def _runlength_record(line: str, path: str, line_no: int, proposer: str) -> tuple[list[int], int]:
    record, bad = _json_record(line, path, line_no)
    if not isinstance(record, dict) or proposer not in record:
        have = sorted(k for k in record if isinstance(record.get(k), list)) if isinstance(record, dict) else []
        raise bad(f"no '{proposer}' run lengths in this record (--acceptance-proposer {proposer}; the record has "
                  f"{', '.join(have) or 'no lists'})")
    values = record[proposer]
    if not isinstance(values, list) or not values:
        raise bad(f"'{proposer}' must be a non-empty list of run lengths, one per output position")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad(f"run lengths are whole numbers >= 1 (1: only the target's own token), got {v!r}")
    prompt = record.get("prompt_tokens", 1)
    if isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 1:
        raise bad(f"prompt_tokens must be a whole number >= 1, got {prompt!r}")
    return values, prompt


def runlength_rates(runs: np.ndarray, match_rate: float, positions: int) -> tuple[float, np.ndarray]:
    """A run-length trace summed up as the per-position model: (the chance a position proposes, P(a >= j
    | proposed) for j = 1..positions), every output position weighted alike. A host proposer proposes
    where its run is longer than 1, and at a run of 1 with ``match_rate``; a model or head (rate 1)
    everywhere."""
    runs = np.asarray(runs)
    proposed = float(np.mean(runs > 1) + match_rate * np.mean(runs == 1))
    reach = np.array([np.mean(runs > j) for j in range(1, positions + 1)]) / max(proposed, _EDGE)
    return proposed, reach


class RunLengthSampler(AcceptanceSampler):
    """The run-length model (module docstring): keyed by request id (the row's ``ROW_SCALE``), each row
    keeps min(k, v - 1) at its position, read from the loop's state (:meth:`watch`); no draws."""

    keyed = True

    def __init__(self, rng: np.random.Generator, trace: RunLengthTrace, num_requests: int,
                 block: int | None = None) -> None:
        record = np.arange(num_requests) % len(trace)
        self.runs, self.start, self.length = trace.runs, trace.start[record], trace.length[record]
        self._loop = None
        super().__init__(rng, block)

    draws_ahead = False  # nothing to draw

    def _fresh(self, n: int, room: int = 0) -> np.ndarray:
        return np.zeros(room)  # nothing is drawn

    def watch(self, loop) -> None:
        self._loop = loop

    def accepted(self, keys: np.ndarray, k) -> np.ndarray:
        state, m = self._loop.state, keys.shape[0]
        ks = np.full(m, k, dtype=np.int64) if isinstance(k, int) else np.asarray(k, dtype=np.int64)
        out = np.empty(m, dtype=np.int64)
        self.rules.runlength_accepted(ks, m, state.rows, state.rowf, self._loop.queue.reqi, self.runs, self.start,
                                      self.length, out)
        return out


@dataclass(frozen=True, eq=False)
class ProposalModel:
    """How many of its k each row proposes (:func:`sim.speculation.proposals.propose_rows`): ``mode`` ALWAYS, MATCH or
    RUNS, with the match rate, the seed the matches hash from, and (RUNS) the run-length sampler's arrays."""

    mode: int = 0
    match_rate: float = 1.0
    seed: int = 0
    runs: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    start: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    length: np.ndarray = field(default_factory=lambda: np.ones(1, dtype=np.int64))

    @property
    def partial(self) -> bool:
        return self.mode != 0


ALWAYS_PROPOSE = ProposalModel()


def proposal_model(spec: AcceptanceSpec, host_proposer: bool, sampler: AcceptanceSampler, seed: int) -> ProposalModel:
    """The run's proposal model: every row proposes, unless the drafter is a host matcher."""
    from sim.speculation.proposals import MATCH, RUNS

    if not host_proposer:
        return ALWAYS_PROPOSE
    rate = 1.0 if spec.match_rate is None else float(spec.match_rate)
    if isinstance(sampler, RunLengthSampler):
        return ProposalModel(RUNS, rate, seed, sampler.runs, sampler.start, sampler.length)
    return ProposalModel(MATCH, rate, seed)


# ------------------------------------------------------------------------- what was drawn


_FOLD_EVERY = 4096  # steps kept before a RecordingSampler folds them into its counts


class RecordingSampler:
    """Wraps a sampler and keeps what it drew, for vLLM's speculation metrics.

    Always: each step's accepted counts (a list append per step; the per-position counts are
    tallied once, at the end). Per request (``per_request``): each row's request id and
    drafted count too, so the rows carry request ids (``keyed``) and the wrapped sampler's own
    per-row values (alpha scales) are looked up from ``values_by_request``.
    """

    def __init__(self, inner: AcceptanceSampler, values_by_request: np.ndarray, per_request: bool) -> None:
        self.inner = inner
        self.keyed = per_request or inner.keyed
        self._lookup = values_by_request if per_request and not inner.keyed else None
        self._per_request = per_request
        self.accepted_log: list[np.ndarray] = []  # kept whole only per request; else folded into counts
        self.ids_log: list[np.ndarray] = []
        self.drafted_log: list = []
        self._counts = np.zeros(0, dtype=np.int64)  # rows that kept exactly a tokens, indexed by a
        self._tallies: list[np.ndarray] = []  # compiled decode runs' counts, folded in by counts()

    @property
    def compilable(self) -> bool:
        """Whether a compiled run can make this sampler's draws: its own draws (not keyed by request,
        not a subclass's own ``accepted``), whose counts it tallies here."""
        return not self.keyed and self.inner.draws_compiled

    def counts(self) -> np.ndarray:
        """Rows that kept exactly a draft tokens, indexed by a, over every step so far."""
        if self._per_request:  # the log is kept whole for the per-request tables
            return np.bincount(np.concatenate(self.accepted_log)) if self.accepted_log else self._counts
        self._fold()
        if self._tallies:
            for tally in self._tallies:
                self._add(tally)
                tally[:] = 0
        return self._counts

    def use_rules(self, rules) -> None:
        """Count with its replica's rules (sim/jit.py)."""
        self.inner.use_rules(rules)

    def watch(self, loop) -> None:
        self.inner.watch(loop)

    @property
    def proposals(self):
        return self.inner.proposals

    def add_tally(self, tally: np.ndarray) -> None:
        """A counts array that compiled runs (sim.serving.compiled) add their draws to."""
        self._tallies.append(tally)

    def _fold(self) -> None:
        """Tally the steps kept so far into the counts: a long run's memory stays flat."""
        if self.accepted_log and not self._per_request:
            self._add(np.bincount(np.concatenate(self.accepted_log)))
            self.accepted_log.clear()

    def _add(self, tally: np.ndarray) -> None:
        if tally.shape[0] > self._counts.shape[0]:
            grown = tally.copy()
            grown[:self._counts.shape[0]] += self._counts
            self._counts = grown
        else:
            self._counts[:tally.shape[0]] += tally

    def accepted(self, values: np.ndarray, k) -> np.ndarray:
        if self._per_request:
            ids = values.astype(np.int64)
            kept = self.inner.accepted(values if self._lookup is None else self._lookup[ids], k)
            self.ids_log.append(ids)
            self.drafted_log.append(k)
        else:
            kept = self.inner.accepted(values, k)
        self.accepted_log.append(kept)
        if len(self.accepted_log) >= _FOLD_EVERY and not self._per_request:
            self._fold()
        return kept


def accepted_per_position(samplers: list[RecordingSampler], k_max: int) -> np.ndarray:
    """vLLM's ``spec_decode_num_accepted_tokens_per_pos``: drafts whose position j was accepted."""
    counts = np.zeros(k_max + 1, dtype=np.int64)
    for sampler in samplers:
        tally = sampler.counts()[:k_max + 1]
        counts[:tally.shape[0]] += tally
    return np.cumsum(counts[::-1])[::-1][1:]  # position j (0-based) kept when a > j


@dataclass(frozen=True)
class PerRequestSteps:
    """Each request's speculative steps: request r's are ``[offset[r], offset[r + 1])``."""

    accepted: np.ndarray
    drafted: np.ndarray
    offset: np.ndarray


def per_request_steps(samplers: list[RecordingSampler], num_requests: int) -> PerRequestSteps:
    """The recorded rows grouped by request, each request's steps in order (steps drafting nothing dropped)."""
    ids, acc, drf = [], [], []
    for s in samplers:
        for i, a, k in zip(s.ids_log, s.accepted_log, s.drafted_log):
            ids.append(i)
            acc.append(a)
            drf.append(np.full(i.shape[0], k, dtype=np.int64) if isinstance(k, int) else k)
    if ids:
        ids_all, acc_all, drf_all = np.concatenate(ids), np.concatenate(acc), np.concatenate(drf)
        keep = drf_all > 0
        ids_all, acc_all, drf_all = ids_all[keep], acc_all[keep], drf_all[keep]
    else:
        ids_all = acc_all = drf_all = np.zeros(0, dtype=np.int64)
    order = np.argsort(ids_all, kind="stable")
    counts = np.bincount(ids_all, minlength=num_requests)
    return PerRequestSteps(acc_all[order], drf_all[order], np.concatenate(([0], np.cumsum(counts))))
