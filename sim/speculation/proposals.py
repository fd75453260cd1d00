"""How many draft tokens each running row proposes and keeps: rules over the state.

A model or a head always drafts the k it is asked for. A host-side matcher (n-gram prompt
lookup, suffix decoding) proposes only where the request's context matches: in vLLM the proposer
runs after each step and the scheduler then schedules each request with the tokens it proposed,
so a row that found no match decodes one token, and a step in which no row matched is a plain
decode. :func:`propose_rows` cuts the policy's per-row k (``ks``) to what each row proposes, before
the scheduler plans the step (both paths, sim/serving/loop.py and kernel.py, call it there):

* ``ALWAYS``: every row proposes its k (models, heads);
* ``MATCH``: a row matches at an output position with probability ``match_rate``;
* ``RUNS``: the run-length trace says (:func:`runlength_accepted`): a position whose run is longer
  than 1 matched; one whose run is 1 (the first guess is rejected, or nothing matched: the trace
  cannot tell) matched with probability ``match_rate``.

Whether a row matches is a pure function of (seed, request, output position) (:func:`unit_hash`),
so it is the same under every policy, batch and path: no draw buffer, no state.

The run-length model (``--acceptance-model runlength``): a trace gives, per request and output
position i, the run v_i of tokens starting at i that the proposer's guesses would get accepted for
(1 = only the target's own token). A row at position i that proposes k keeps min(k, v_i - 1). The
position is the request's emitted tokens less one (its first came from the prefill); request g
replays its record's values (``runs[start[g]:start[g] + length[g]]``), wrapping round past its end.

The other acceptance models keep what :func:`count_accepted` reads from the sampler's draws
(sim.speculation.acceptance hands them over, to the loop and to the compiled runs alike).
"""

from __future__ import annotations

from sim.scheduler.layout import POSITIONS, REQ_OUTPUT, ROW_REMAINING, ROW_REQ, ROW_SCALE, SHARED

ALWAYS, MATCH, RUNS = 0, 1, 2
_PRIME = 2147483647  # 2**31 - 1: every product below stays under 2**62, exact in int64 and in Python


def _mix(h):
    """Scramble a value below 2**31: Park-Miller multiplications interleaved with xor-shifts (the shifts
    make it non-linear, so neighbouring inputs give unrelated outputs)."""
    for _ in range(3):
        h = (h * 48271) % _PRIME
        h ^= h >> 13
        h = (h * 69621) % _PRIME
        h ^= h >> 17
    return h


def unit_hash(seed, request, position):
    """A uniform in [0, 1) from (seed, request, position), mixed in one at a time (exact integer
    arithmetic below 2**62, identical interpreted and compiled)."""
    h = _mix((seed % _PRIME) ^ 0x2545F491)
    h = _mix((h ^ (request % _PRIME)) % _PRIME)
    h = _mix((h ^ (position % _PRIME)) % _PRIME)
    return h / _PRIME


def row_position(rows, reqi, i):
    """Output position of row i's next token: its emitted tokens less one."""
    return reqi[REQ_OUTPUT, rows[ROW_REQ, i]] - rows[ROW_REMAINING, i] - 1


def run_at(rowf, rows, reqi, i, runs, start, length):
    """The run v at row i's position (its request's record, by the request id in ``ROW_SCALE``)."""
    g = int(rowf[ROW_SCALE, i])
    return runs[start[g] + row_position(rows, reqi, i) % length[g]]


def propose_rows(ks, m, rows, rowf, reqi, proposer):
    """Cut rows [0, m)'s k (``ks``, in place) to what each proposes (the module docstring; ``proposer``:
    the mode, match rate, seed and run-length arrays, sim.serving.step.Proposer); returns (the largest
    k left, whether the rows' ks now differ)."""
    mode = proposer.mode
    top = 0
    for i in range(m):
        k = ks[i]
        if k and mode != ALWAYS:
            matched = False
            if mode == RUNS and run_at(rowf, rows, reqi, i, proposer.runs, proposer.start, proposer.length) > 1:
                matched = True
            elif unit_hash(proposer.seed, rows[ROW_REQ, i], row_position(rows, reqi, i)) < proposer.match_rate:
                matched = True
            if not matched:
                ks[i] = 0
                k = 0
        if k > top:
            top = k
    ragged = False
    for i in range(m):
        if ks[i] != top:
            ragged = True
    return top, ragged


def runlength_accepted(ks, m, rows, rowf, reqi, runs, start, length, out):
    """Draft tokens rows [0, m) keep: min(k_i, v_i - 1) at each row's position."""
    for i in range(m):
        v = run_at(rowf, rows, reqi, i, runs, start, length) - 1
        k = ks[i]
        out[i] = k if k < v else v


def count_accepted(kind, draws_i, draws_f, pos, scale, ks, m, neg_rates, out):
    """Draft tokens rows [0, m) keep at their ks, from the sampler's draws at ``pos`` (sim.speculation.acceptance):
    SHARED, G precomputed (one alpha); SCALED, an exponential times the row's scale; POSITIONS, the
    number of rates a uniform falls under."""
    n_rates = neg_rates.shape[0]
    for i in range(m):
        k = ks[i]
        if kind == SHARED:
            a = draws_i[pos + i]
            if a > k:
                a = k
        elif kind == POSITIONS:
            u = draws_f[pos + i]
            a = 0
            while a < n_rates and neg_rates[a] < u:
                a += 1
            if a > k:
                a = k
        else:
            v = draws_f[pos + i] * scale[i]
            if v > k:
                v = k
            a = int(v)
        out[i] = a


RULES = (_mix, unit_hash, row_position, run_at, propose_rows, runlength_accepted, count_accepted)
INLINED = (count_accepted,)  # compiled into its callers (sim/jit.py)
