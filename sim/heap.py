"""Give freed heap memory back to the system after an array doubles.

A long run grows its arrays by doubling (sim/serving/records.py, queues.py, state.py). The
old array is freed once copied, but glibc's allocator keeps the pages of a freed block that
sits inside its heap, and a doubled array seldom fits the hole its predecessor left; over a
million-request cluster run those holes added about 80 MB to the peak RSS. ``malloc_trim``
returns them (it takes milliseconds, and a run doubles a few dozen times). Elsewhere than
glibc (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed() -> None:
    """Return the heap's free pages to the system (after a doubled array's predecessor is freed)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
