"""What the studies' serving runs share: the engine's batch limit comes from the profile.

A GPU serves up to hundreds of sequences per step (vLLM's ``max_num_seqs`` defaults to
256), a 2-core CPU a few dozen; the scenario default (32) would cap a GPU study far
below the batch sizes where speculation stops paying. Each study therefore lets the
engine batch up to the largest batch the profile measured (32 on the CPU profiles, as
before; 256 on the composed GPU ones).
"""

from __future__ import annotations


def max_batch_for(profile: str) -> int:
    """The largest batch size the profile measured a target decode step at."""
    from sim.profile import load_profile

    return int(load_profile(profile).phase("decode", "target").batch_size.max())
