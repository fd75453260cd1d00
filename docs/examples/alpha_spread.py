"""Per-request alpha of a run with --alpha-distribution beta, and what it did (docs/acceptance.md).

    python docs/examples/alpha_spread.py RUN
"""

import json
import sys

import pandas as pd

out = sys.argv[1]
r = pd.read_csv(f"{out}/requests.csv")
m = json.load(open(f"{out}/summary.json"))["metrics"]
print(r.alpha.describe().round(3).to_string())
rate = r.accepted_tokens / r.drafted_tokens
print(f"corr(alpha, accepted/drafted) {r.alpha.corr(rate):.2f}")
print(f"acceptance_rate {m['acceptance_rate']:.3f} mean_acceptance_length {m['mean_acceptance_length']:.3f}")
