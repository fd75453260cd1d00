"""Speculation-length policies: given the running batch, how many tokens to draft.

A policy imports nothing of ``sim`` or ``calibrate``. It sees a :class:`BatchView`
before each decode step, returns k (0 = plain decoding), and hears back what was
accepted through :class:`StepFeedback`. The simulator and the real replay call the
same policy objects.
"""

from policies.base import BatchView, CostModelLike, Policy, PolicyError, StepFeedback
from policies.registry import available_policies, make_policy, plugin_failure, policy_class

__all__ = [
    "BatchView",
    "CostModelLike",
    "Policy",
    "PolicyError",
    "StepFeedback",
    "available_policies",
    "make_policy",
    "plugin_failure",
    "policy_class",
]
