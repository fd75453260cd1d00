"""One line per run folder named on the command line (docs/policies.md).

    python docs/examples/compare.py none fixed3 mine tuned
"""

import json
import sys

for out in sys.argv[1:]:
    m = json.load(open(f"{out}/summary.json"))["metrics"]
    print(f"{out:12} mean TPOT {m['mean_tpot_ms']:4.0f} ms  p99 TTFT {m['p99_ttft_ms'] / 1000:4.1f} s  "
          f"mean E2EL {m['mean_e2el_ms'] / 1000:5.1f} s  p99 E2EL {m['p99_e2el_ms'] / 1000:5.1f} s  "
          f"mean k {m['mean_k']:.2f}  mean batch {m['mean_batch_size']:4.1f}")
