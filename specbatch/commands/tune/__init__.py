"""``specbatch tune``: the speculation schedule (k per batch-size band) that is best for a traffic.

``space`` says what is searched (bands, k range) and turns a schedule into the policies
that run it and the engines' configs; ``objective`` says what is minimised, in vLLM's
metric names; ``trials`` runs candidate schedules on the sweep's executors and keeps each
run in a resumable store; ``search`` is the coordinate descent with successive halving
over seeds; ``baselines`` and ``report`` compare the winner on held-out seeds and write
the folder; ``cli`` is the command.
"""

# The defaults of the command and the API (kept here, light to import: the command line's parser
# imports the command's module whatever command runs).
DEFAULT_BANDS = 8       # batch-size bands
DEFAULT_K_MAX = 7       # the largest k tried (or the profile's k_max if smaller)
DEFAULT_SEEDS = 3       # search seeds, and as many held-out seeds
