"""The k a run chose at each batch size, from its steps.csv (docs/policies.md).

    python docs/examples/k_by_batch.py RUN/steps.csv
"""

import sys

import pandas as pd

steps = pd.read_csv(sys.argv[1])
decode = steps[steps.phase == 1]  # decode steps have phase 1
print(decode.groupby("batch_size").k.agg(["min", "max", "count"]).T.to_string())
