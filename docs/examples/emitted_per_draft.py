"""Acceptance length, acceptance rate and tokens emitted per draft of run folders (docs/acceptance.md).

    python docs/examples/emitted_per_draft.py RUN [RUN ...]
"""

import json
import sys

import pandas as pd

for out in sys.argv[1:]:
    m = json.load(open(f"{out}/summary.json"))["metrics"]
    steps = pd.read_csv(f"{out}/steps.csv")
    decode = steps[steps.phase == 1]
    print(f"{out}: mean_acceptance_length {m['mean_acceptance_length']:.2f}, acceptance_rate "
          f"{m['acceptance_rate']:.3f}, emitted per draft {decode.emitted_tokens.sum() / decode.running.sum():.2f}")
