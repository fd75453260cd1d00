from __future__ import annotations

from pathlib import Path

import pytest

from tests.synthetic import make_profile


@pytest.fixture(scope="session")
def synthetic_profile(tmp_path_factory) -> Path:
    """A hand-made profile with costs linear in work (see tests/synthetic.py)."""
    return make_profile(tmp_path_factory.mktemp("profiles") / "synthetic")


@pytest.fixture
def run_config(synthetic_profile):
    """Build a RunConfig from flag-style overrides on top of the shipped defaults."""
    from sim.config import load_config

    def build(**overrides):
        flags = {"profile": (str(synthetic_profile), "--profile")}
        for key, value in overrides.items():
            flags[key.replace("__", ".")] = (value, f"--{key}")
        return load_config(None, flags)

    return build
