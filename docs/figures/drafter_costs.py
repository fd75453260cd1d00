"""What each speculation method's drafting costs a step on the shipped H100 Llama-3.1-8B profile.

    python docs/figures/drafter_costs.py

For k = 3 draft tokens per sequence at 1,024 tokens of context: the drafting (a draft model's three
passes, a head's first pass over the four verified positions and two later ones, Medusa's three
heads in one pass, a host proposer's look-up), the target's verification pass beside it, and
the KV capacity each method leaves. Last, SpecDecode-Bench's published fit of vLLM's EAGLE
drafter on H100 (arXiv 2601.11580; 2.14 ms + 0.84 us per speculative token + 2.4 ns per KV token)
at the same points, beside the composed EAGLE-3 drafting.
"""

from __future__ import annotations

from sim.costmodel.model import CostModel, Drafter
from sim.costmodel.profile import DEFAULT_PROFILE, load_profile
from sim.speculation.methods import from_vllm, kv_capacity_for

BATCHES = (1, 16, 64, 256)
K, CONTEXT = 3, 1024
METHODS = (("draft_model", Drafter("model", "draft")), ("eagle", Drafter("head", "eagle")),
           ("eagle3", Drafter("head", "eagle3")), ("mtp", Drafter("head", "mtp")), ("medusa", Drafter("heads", "medusa")),
           ("ngram", Drafter("host", "ngram")), ("suffix", Drafter("host", "suffix")))


def published_eagle_fit(batch: int) -> float:
    """SpecDecode-Bench's drafter fit (seconds) for a step of ``batch`` sequences at k = 3, CONTEXT tokens each."""
    return 2.14e-3 + 0.84e-6 * batch * K + 2.4e-9 * batch * CONTEXT


def main() -> None:
    profile = load_profile(DEFAULT_PROFILE)
    base = CostModel(profile)
    target = [float(base.decode_target(batch_size=b, query_tokens=K + 1, context_tokens=CONTEXT)) for b in BATCHES]
    print(f"{DEFAULT_PROFILE}: drafting k = {K} tokens per sequence at {CONTEXT} tokens of context (ms)")
    print(f"{'method':<12}" + "".join(f"{'b = ' + str(b):>10}" for b in BATCHES) + f"{'KV capacity':>14}")
    for name, drafter in METHODS:
        model = base.with_drafter(drafter)
        cells = "".join(f"{1e3 * float(model.drafting_times(b, K, CONTEXT)):>10.3f}" for b in BATCHES)
        capacity = kv_capacity_for(profile, from_vllm({"method": name, "num_speculative_tokens": K}))
        print(f"{name:<12}{cells}{capacity:>14,}")
    print(f"{'(target, q=4)':<12}" + "".join(f"{1e3 * t:>10.3f}" for t in target))
    print(f"{'(fit, EAGLE)':<12}" + "".join(f"{1e3 * published_eagle_fit(b):>10.3f}" for b in BATCHES))


if __name__ == "__main__":
    main()
