"""The table the `context` policy builds for a scenario, one line per context band (docs/policy-context.md).

    python docs/examples/context_table.py SCENARIO.toml
"""

import sys
from itertools import groupby

from sim.config import load_config
from sim.simulate import prepare

run = prepare(load_config(sys.argv[1], {"output.records": ("none", "--records")}))
table = run.policy.table  # [[min_bs, max_bs, min_ctx, max_ctx, k], ...], built at bind()
print("contexts     batch -> k")
for (lo, hi), rows in groupby(sorted(table, key=lambda r: (r[2], r[0])), key=lambda r: (r[2], r[3])):
    bands = ", ".join(f"{a} -> {k}" if a == b else f"{a}-{b} -> {k}" for a, b, _, _, k in rows)
    print(f"{lo:>5}-{hi:<5}  {bands}")
