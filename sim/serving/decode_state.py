"""What the compiled decode run and its caller share (sim.serving.compiled): numbers, no code."""

# decode_run's stop reasons
IDLE, ARRIVAL, ADMIT, REFILL, LIMIT = 0, 1, 2, 3, 4
MANY = 1 << 62  # no limit on a run's steps

# Indices into the int state array the kernel reads and updates in place.
(RUNNING, KV_USED, FRESH, TOTAL_REMAINING, TOTAL_FINAL_CONTEXT, DECODE_COUNT, K_SUM, DRAW_POS, REC_POS, REC_END,
 ITL_POS, ITL_END, STEPS) = range(13)
N_INT_STATE = 13
# ... and into the float state array.
NOW, LAST_DECODE_END, PENDING_END = 0, 1, 2

# Acceptance samplers the kernel can draw from (sim.acceptance), by how a draw becomes a count.
SHARED, SCALED, POSITIONS = 0, 1, 2

# How the kernel picks k: a table by batch size (fixed, none, lut), or goodput's argmax (policies.goodput).
STATIC_K, GOODPUT_K = 0, 1
# goodput's scalars (DecodeRuns packs the policy's state into a float array) ...
ACCEPTED_AVG, TESTED_AVG, ALPHA, SMOOTHING, PRIOR, MARGIN, PRICES_CATCH_UP = range(7)
N_GOODPUT_STATE = 7
# ... and its per-position rows: EMAs of accepted and tested, the rates r_j, E[tokens](k) (k = 0..k_max).
POS_ACCEPTED, POS_TESTED, POS_RATES, EXPECTED = range(4)
