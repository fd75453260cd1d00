"""Speculation-length policies (policies/): the registry, the built-ins and the batch view."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from policies import BatchView, Policy, PolicyError, StepFeedback, available_policies, make_policy
from policies.fixed import FixedK
from policies.none import NoSpeculation


def _view(k_max: int = 8, running: int = 3) -> BatchView:
    view = BatchView(k_max)
    view.batch_size = view.running = running
    view.remaining_tokens = np.arange(1, running + 1, dtype=np.int64)
    view.final_context_tokens = np.full(running, 100, dtype=np.int64)
    return view


def test_builtin_policies_are_listed():
    assert available_policies() == ["adaptive", "context", "fixed", "goodput", "lut", "none", "sglang-adaptive",
                                    "trtllm-schedule", "vllm-dynamic"]


def test_make_policy_none_never_speculates():
    policy = make_policy("none", {})
    assert isinstance(policy, NoSpeculation)
    assert policy.max_k == 0 and policy.choose_k(_view()) == 0 and policy.params() == {}


@pytest.mark.parametrize("k", [0, 1, 5])
def test_make_policy_fixed_returns_its_k_every_step(k):
    policy = make_policy("fixed", {"k": k})
    assert isinstance(policy, FixedK)
    assert policy.max_k == k and policy.params() == {"k": k}
    assert [policy.choose_k(_view(running=b)) for b in (1, 4, 32)] == [k, k, k]


def test_make_policy_fixed_defaults_to_k_three():
    assert make_policy("fixed").k == 3


def test_unknown_policy_name_lists_the_builtins():
    message = "unknown policy 'smartspec' \\(built in: adaptive, context, fixed, goodput, lut, none"
    with pytest.raises(PolicyError, match=message) as info:
        make_policy("smartspec", {})
    assert info.value.field == "name" and "module:Class" in info.value.message


@pytest.mark.parametrize("name,params,field", [
    ("fixed", {"kk": 2}, "kk"),
    ("fixed", {"k": 2, "window": 3}, "window"),
    ("none", {"k": 3}, "k"),  # 'none' takes no parameters at all
])
def test_unknown_parameter_is_named(name, params, field):
    with pytest.raises(PolicyError, match=f"policy '{name}' takes no parameter '{field}'") as info:
        make_policy(name, params)
    assert info.value.field == field


@pytest.mark.parametrize("k", [-1, 1.5, "3", True, None])
def test_fixed_k_rejects_negative_or_non_integer_k(k):
    with pytest.raises(PolicyError, match="k must be a whole number >= 0") as info:
        make_policy("fixed", {"k": k})
    assert info.value.field == "k"


def test_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


USER_MODULE = '''
from policies import Policy


class HalfBatch(Policy):
    """Drafts fewer tokens as the batch grows: k = max(0, limit - running // 2)."""

    name = "half-batch"

    def __init__(self, limit=4, **extra):
        self.limit, self.extra, self.seen = limit, extra, 0

    @property
    def max_k(self):
        return self.limit

    def choose_k(self, view):
        return max(0, self.limit - view.running // 2)

    def observe(self, feedback):
        self.seen += feedback.accepted_tokens


class Strict(Policy):
    def __init__(self, depth):
        self.depth = depth

    @property
    def max_k(self):
        return self.depth

    def choose_k(self, view):
        return self.depth


class NotAPolicy:
    def __init__(self, k=1):
        self.k = k


not_a_class = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"user_policies_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_user_policy_loads_as_module_colon_class(user_module):
    policy = make_policy(f"{user_module}:HalfBatch", {"limit": 6, "anything": 1})
    assert type(policy).__name__ == "HalfBatch" and isinstance(policy, Policy)
    assert policy.limit == 6 and policy.extra == {"anything": 1}  # **kwargs policies take any parameter
    assert [policy.choose_k(_view(running=b)) for b in (1, 4, 20)] == [6, 4, 0]
    feedback = StepFeedback()
    feedback.accepted_tokens = 5
    policy.observe(feedback)
    assert policy.seen == 5


def test_user_policy_parameters_are_checked_against_its_signature(user_module):
    assert make_policy(f"{user_module}:Strict", {"depth": 2}).max_k == 2
    with pytest.raises(PolicyError, match="takes no parameter 'width'") as info:
        make_policy(f"{user_module}:Strict", {"depth": 2, "width": 3})
    assert info.value.field == "width"
    with pytest.raises(PolicyError, match="depth"):
        make_policy(f"{user_module}:Strict", {})  # a required parameter missing


@pytest.mark.parametrize("attr", ["NotAPolicy", "not_a_class", "Missing"])
def test_module_colon_name_that_is_not_a_policy_subclass_is_rejected(user_module, attr):
    with pytest.raises(PolicyError, match="does not name a subclass of policies.Policy") as info:
        make_policy(f"{user_module}:{attr}", {})
    assert info.value.field == "name"


def test_module_that_cannot_be_imported_is_reported():
    with pytest.raises(PolicyError, match="cannot import module 'no_such_module_xyz'") as info:
        make_policy("no_such_module_xyz:Policy", {})
    assert info.value.field == "name"


@pytest.mark.parametrize("k,k_max,ok", [(3, 3, True), (3, 7, True), (0, 0, True), (4, 3, False)])
def test_bind_rejects_max_k_above_the_profiles_k_max(k, k_max, ok):
    policy = FixedK(k)
    if ok:
        policy.bind(k_max)
    else:
        with pytest.raises(PolicyError, match=f"k = {k} is beyond the profile's measured k_max = {k_max}") as info:
            policy.bind(k_max)
        assert info.value.field == "k"


def test_none_policy_binds_to_any_profile():
    NoSpeculation().bind(0)


def test_batch_view_context_tokens_is_final_context_minus_remaining():
    view = BatchView(k_max=4)
    assert view.context_tokens.shape == (0,)
    view.final_context_tokens = np.array([140, 300, 57], dtype=np.int64)
    view.remaining_tokens = np.array([40, 1, 7], dtype=np.int64)
    np.testing.assert_array_equal(view.context_tokens, [100, 299, 50])
    view.remaining_tokens -= 1  # the engine updates in place; the view follows
    np.testing.assert_array_equal(view.context_tokens, [101, 300, 51])
    assert view.k_max == 4
