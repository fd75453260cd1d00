"""What a simulated run can honour: the largest times and token counts its arithmetic keeps exact.

One place for these bounds, so that the config, traces and generated workloads refuse the
same inputs with the same reason (see docs/errors.md).
"""

from __future__ import annotations

# Simulated seconds. The clock is a float64: at 1e9 s (about 32 years) it still resolves
# 0.12 microseconds, far finer than any engine step, whereas at 1e16 s adding a 1 ms step
# would no longer move it and every latency would read 0.
MAX_TIME_S = 1e9

# Tokens of one prompt or one output. Far beyond any model's context, and sums over a
# whole batch of such requests stay inside int64.
MAX_TOKENS = 2**31 - 1
