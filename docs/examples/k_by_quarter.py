"""The share of decode steps choosing each k, by quarter of the run (docs/policy-adaptive.md).

    python docs/examples/k_by_quarter.py RUN/steps.csv
"""

import sys

import numpy as np
import pandas as pd

steps = pd.read_csv(sys.argv[1])
decode = steps[steps.phase == 1].reset_index(drop=True)
print(f"{len(decode)} decode steps")
ks = range(int(decode.k.max()) + 1)
print("quarter  time (s)     " + "  ".join(f"k={k}" for k in ks) + "   mean batch")
for i, rows in enumerate(np.array_split(np.arange(len(decode)), 4), start=1):
    part = decode.iloc[rows]
    share = part.k.value_counts(normalize=True)
    print(f"{i:7}  {part.start_s.iloc[0]:4.0f}-{part.end_s.iloc[-1]:4.0f}  "
          + "  ".join(f"{share.get(k, 0.0):.2f}" for k in ks) + f"  {part.running.mean():10.1f}")
