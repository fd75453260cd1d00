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
    from sim.costmodel.profile import load_profile

    return int(load_profile(profile).phase("decode", "target").batch_size.max())


def study_config(profile: str, policy: str, seed: int, settings: dict | None = None):
    """A study run's config: the default scenario, this profile, policy and seed, the profile's
    batch limit, then ``settings`` (config keys, e.g. ``{"workload.rate": 2.0}``), each named in
    errors by the flag that sets it."""
    from sim.config import load_config

    values = {"profile": profile, "policy.name": policy, "seed": seed,
              "engine.max_batch_size": max_batch_for(profile), **(settings or {})}
    return load_config(None, {key: (value, "--" + key.split(".")[-1].replace("_", "-"))
                              for key, value in values.items()})
