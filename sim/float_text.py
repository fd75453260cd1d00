"""The shortest text of a float64 that reads back as the same float64, as pyarrow's CSV writer prints it.

A run folder's tables print every float at full precision (specbatch/commands/outputs.py): the
shortest decimal that round-trips, and of those the nearest to the float. pyarrow's cast to strings
(Google's double-conversion) did that for sim/csv_rows.py at 115-160 ns a value, most of a long
run's writing (a million requests: some 16 million floats). :func:`write_shortest` finds the same
digits by Ryu (Ulf Adams, "Ryū: fast float-to-string conversion", PLDI 2018), the published
algorithm that gives the shortest, nearest digits with 64-bit arithmetic and two tables of powers
of five, and lays them out as double-conversion does for pyarrow: plain decimals for a decimal
exponent from -6 to 9 (``0.000001``, ``1234567890``), otherwise ``1.5e+20`` and ``1e-7``; ``-0``;
``inf``. tests/test_float_text.py holds it to pyarrow's bytes over some 600,000 values, every kind there is.
The tables are made at import, from Python's integers (2 ms).

The functions are in the subset of Python numba compiles, on unsigned 64-bit integers: a product's
high half is put together from 32-bit halves (numba has no 128-bit integer), and every constant is
an ``np.uint64``, since numba turns an unsigned and a signed integer into a float.
"""

from __future__ import annotations

import numpy as np

MANTISSA_BITS, BIAS = 52, 1023
POW5_INV_BITCOUNT = POW5_BITCOUNT = 125
DECIMAL_LOW, DECIMAL_HIGH = -6, 10  # decimal exponents printed as plain decimals (pyarrow's double-conversion)
LONGEST = 25  # bytes of the longest text: -0.0000012345678901234567 (-1.2345678901234567e+100: 24)
_U0, _U1, _U2, _U4, _U5, _U10, _U100 = (np.uint64(v) for v in (0, 1, 2, 4, 5, 10, 100))
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def _split_tables() -> tuple[np.ndarray, np.ndarray]:
    """Ryu's tables, each entry 128 bits as (low, high) words: 2**j // 5**i + 1 (j: 5**i's bit length - 1 +
    125) for the positive binary exponents, and 5**i's leading 125 bits for the negative ones."""
    inverse, powers = np.zeros((342, 2), np.uint64), np.zeros((326, 2), np.uint64)
    mask = (1 << 64) - 1
    for i in range(342):
        value = (1 << (5 ** i).bit_length() - 1 + POW5_INV_BITCOUNT) // 5 ** i + 1
        inverse[i] = value & mask, value >> 64
    for i in range(326):
        shift = (5 ** i).bit_length() - POW5_BITCOUNT
        value = 5 ** i >> shift if shift >= 0 else 5 ** i << -shift
        powers[i] = value & mask, value >> 64
    return inverse, powers


POW5_INV_SPLIT, POW5_SPLIT = _split_tables()
POWERS_OF_TEN = np.array([10 ** i for i in range(20)], np.uint64)
DIGIT_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), np.uint8).copy()  # "00" .. "99"


def _pow5bits(e):
    """Bits of 5**e (1 for e = 0), for 0 <= e <= 3528."""
    return ((e * 1217359) >> 19) + 1


def _log10_pow2(e):
    """floor(log10(2**e)), for 0 <= e <= 1650."""
    return (e * 78913) >> 18


def _log10_pow5(e):
    """floor(log10(5**e)), for 0 <= e <= 2620."""
    return (e * 732923) >> 20


def _multiple_of_pow5(value, p):
    """Whether 5**p divides ``value`` (> 0)."""
    count = 0
    while value % _U5 == _U0:
        value //= _U5
        count += 1
    return count >= p


def _high_product(a, b):
    """The high 64 bits of the 128-bit product a * b, and its low 64 bits."""
    a_lo, a_hi = a & _LOW32, a >> _SHIFT32
    b_lo, b_hi = b & _LOW32, b >> _SHIFT32
    lo_lo, lo_hi, hi_lo, hi_hi = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    middle = (lo_lo >> _SHIFT32) + (lo_hi & _LOW32) + (hi_lo & _LOW32)
    return hi_hi + (lo_hi >> _SHIFT32) + (hi_lo >> _SHIFT32) + (middle >> _SHIFT32), (middle << _SHIFT32) | (lo_lo & _LOW32)


def _mul_shift(m, low, high, j):
    """(m * (high * 2**64 + low)) >> j, for m of at most 55 bits and 64 < j < 128."""
    high1, low1 = _high_product(m, high)
    high0 = _high_product(m, low)[0]
    halves = (high0 & _LOW32) + (low1 & _LOW32)  # high0 + low1 by halves: its carry, and no wrapping
    upper = (high0 >> _SHIFT32) + (low1 >> _SHIFT32) + (halves >> _SHIFT32)  # (interpreted numpy warns of one)
    total = ((upper & _LOW32) << _SHIFT32) | (halves & _LOW32)
    high1 += upper >> _SHIFT32
    shift = np.uint64(j - 64)
    return (high1 << (np.uint64(64) - shift)) | (total >> shift)


def shortest_digits(bits):
    """The shortest decimal ``digits * 10**exponent`` that reads back as the finite, non-zero float64 whose
    magnitude's bits are ``bits``, the nearest to it of those (Ryu's ``d2d``): (digits, exponent)."""
    mantissa = bits & np.uint64((1 << MANTISSA_BITS) - 1)
    biased = np.int64(bits >> np.uint64(MANTISSA_BITS))
    if biased == 0:
        e2 = 1 - BIAS - MANTISSA_BITS - 2
        m2 = mantissa
    else:
        e2 = biased - BIAS - MANTISSA_BITS - 2
        m2 = mantissa | np.uint64(1 << MANTISSA_BITS)
    accept_bounds = (m2 & _U1) == _U0
    mv = _U4 * m2
    mm_shift = _U1 if mantissa != _U0 or biased <= 1 else _U0
    vm_trailing_zeros = False
    vr_trailing_zeros = False
    if e2 >= 0:
        q = _log10_pow2(e2) - (1 if e2 > 3 else 0)
        e10 = q
        k = POW5_INV_BITCOUNT + _pow5bits(q) - 1
        j = -e2 + q + k
        low, high = POW5_INV_SPLIT[q, 0], POW5_INV_SPLIT[q, 1]
        vr = _mul_shift(mv, low, high, j)
        vp = _mul_shift(mv + _U2, low, high, j)
        vm = _mul_shift(mv - _U1 - mm_shift, low, high, j)
        if q <= 21:  # only one of mp, mv and mm can be a multiple of 5, if any
            if mv % _U5 == _U0:
                vr_trailing_zeros = _multiple_of_pow5(mv, q)
            elif accept_bounds:
                vm_trailing_zeros = _multiple_of_pow5(mv - _U1 - mm_shift, q)
            elif _multiple_of_pow5(mv + _U2, q):
                vp -= _U1
    else:
        q = _log10_pow5(-e2) - (1 if -e2 > 1 else 0)
        e10 = q + e2
        i = -e2 - q
        k = _pow5bits(i) - POW5_BITCOUNT
        j = q - k
        low, high = POW5_SPLIT[i, 0], POW5_SPLIT[i, 1]
        vr = _mul_shift(mv, low, high, j)
        vp = _mul_shift(mv + _U2, low, high, j)
        vm = _mul_shift(mv - _U1 - mm_shift, low, high, j)
        if q <= 1:  # mv = 4 * m2 has at least two trailing zero bits
            vr_trailing_zeros = True
            if accept_bounds:
                vm_trailing_zeros = mm_shift == _U1
            else:
                vp -= _U1
        elif q < 63:
            vr_trailing_zeros = (mv & ((_U1 << np.uint64(q)) - _U1)) == _U0
    removed = 0
    last_removed = _U0
    if vm_trailing_zeros or vr_trailing_zeros:  # the general case (under 1% of values)
        # Ryu's two loops in one: while the bounds differ beyond the last digit, then (once equal there, they
        # stay so) while the lower bound, exact, ends in a zero
        while vp // _U10 > vm // _U10 or (vm_trailing_zeros and vm % _U10 == _U0):
            vm_trailing_zeros = vm_trailing_zeros and vm % _U10 == _U0
            vr_trailing_zeros = vr_trailing_zeros and last_removed == _U0
            last_removed = vr % _U10
            vr //= _U10
            vp //= _U10
            vm //= _U10
            removed += 1
        if vr_trailing_zeros and last_removed == _U5 and vr % _U2 == _U0:
            last_removed = _U4  # the exact value ends in 5: round to even
        up = (vr == vm and (not accept_bounds or not vm_trailing_zeros)) or last_removed >= _U5
    else:
        round_up = False
        if vp // _U100 > vm // _U100:  # two digits at a time first
            round_up = vr % _U100 >= np.uint64(50)
            vr //= _U100
            vp //= _U100
            vm //= _U100
            removed += 2
        while vp // _U10 > vm // _U10:
            round_up = vr % _U10 >= _U5
            vr //= _U10
            vp //= _U10
            vm //= _U10
            removed += 1
        up = vr == vm or round_up
    return vr + (_U1 if up else _U0), e10 + removed


def write_shortest(bits, out, pos):
    """Write the text (the module docstring) of the float64 whose bits are ``bits`` (a uint64: the value
    viewed as one) at ``out[pos:]``; returns the position after it. Not for NaN (a CSV's empty cell)."""
    if bits >> np.uint64(63):
        out[pos] = 45  # '-'
        pos += 1
        bits &= np.uint64((1 << 63) - 1)
    if bits == _U0:
        out[pos] = 48  # '0'
        return pos + 1
    if bits == np.uint64(0x7FF0000000000000):
        out[pos], out[pos + 1], out[pos + 2] = 105, 110, 102  # 'inf'
        return pos + 3
    digits, exponent = shortest_digits(bits)
    length = decimal_length(digits)
    scientific = exponent + length - 1
    if DECIMAL_LOW <= scientific < DECIMAL_HIGH:
        point = scientific + 1  # digits before the decimal point (<= 0: zeros after "0." first)
        if point <= 0:
            out[pos], out[pos + 1] = 48, 46  # '0.'
            pos += 2
            for _ in range(-point):
                out[pos] = 48
                pos += 1
            write_digits(digits, length, out, pos, 0)
            return pos + length
        if point >= length:
            write_digits(digits, length, out, pos, 0)
            pos += length
            for _ in range(point - length):
                out[pos] = 48
                pos += 1
            return pos
        write_digits(digits, length, out, pos, point)
        return pos + length + 1
    write_digits(digits, length, out, pos, 1 if length > 1 else 0)
    pos += length + (1 if length > 1 else 0)
    out[pos] = 101  # 'e'
    if scientific < 0:
        out[pos + 1] = 45  # '-'
        scientific = -scientific
    else:
        out[pos + 1] = 43  # '+'
    pos += 2
    width = 1 if scientific < 10 else (2 if scientific < 100 else 3)
    for at in range(width - 1, -1, -1):
        out[pos + at] = 48 + scientific % 10
        scientific //= 10
    return pos + width


def write_digits(digits, length, out, pos, point):
    """The uint64 ``digits``' ``length`` decimal digits at ``out[pos:]``, two at a time, a '.' after the first
    ``point`` of them where ``point`` > 0 (the digits are written one place on, then the first ``point`` of them
    moved back). sim/csv_rows.py prints its integers with it too."""
    end = pos + length + (1 if point > 0 else 0)
    while digits >= _U100:
        q = digits // _U100
        pair = (digits - q * _U100) * _U2
        out[end - 1], out[end - 2] = DIGIT_PAIRS[pair + _U1], DIGIT_PAIRS[pair]
        end -= 2
        digits = q
    if digits >= _U10:
        pair = digits * _U2
        out[end - 1], out[end - 2] = DIGIT_PAIRS[pair + _U1], DIGIT_PAIRS[pair]
    else:
        out[end - 1] = np.uint8(48) + np.uint8(digits)
    if point > 0:
        for at in range(pos, pos + point):
            out[at] = out[at + 1]
        out[pos + point] = 46  # '.'


def decimal_length(digits):
    """How many decimal digits the uint64 ``digits`` (at most 2**63: an int64's magnitude) has; 1 for 0."""
    length = 1
    while length < 20 and digits >= POWERS_OF_TEN[length]:
        length += 1
    return length


RULES = (_pow5bits, _log10_pow2, _log10_pow5, _multiple_of_pow5, _high_product, _mul_shift, shortest_digits,
         write_shortest, write_digits, decimal_length)
