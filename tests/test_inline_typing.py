"""A rule compiled into its callers is typed for inlining once per argument types and never compiled on its
own (sim/jit.py ``_type_inlined_rules_once``): numba's own way typed the engine's deepest rules dozens of
times over and compiled every level whole, most of the engine's minutes of compilation."""

from __future__ import annotations

import pytest

numba = pytest.importorskip("numba")

from numba.core import event, typed_passes  # noqa: E402
from numba.core.typing.templates import _OverloadFunctionTemplate  # noqa: E402
from numba.extending import register_jitable  # noqa: E402

from sim import jit  # noqa: E402

# A leaf called three times by a middle rule that the top calls twice, both inlined as the engine's rules are.
SOURCE = """
def leaf(x):
    return x + 1

def middle(x):
    return leaf(x) + leaf(x * 2) + leaf(x * 3)

def top(x):
    return middle(x) + middle(x + 1)
"""


def _rules() -> dict:
    """A fresh set of the three functions (each registration is numba's for the whole process)."""
    scope: dict = {}
    exec(SOURCE, scope)
    for name in ("leaf", "middle"):
        register_jitable(_nrt=False, inline="always")(scope[name])
    return scope


def _compile_top(scope: dict) -> tuple[int, list, int]:
    """Compile ``top``: how often ``leaf``'s IR was typed, which functions numba compiled, and ``top(5)``."""
    typed = []
    numba_typing = typed_passes.type_inference_stage

    def counting(typingctx, targetctx, interp, *args, **kwargs):
        typed.append(interp.func_id.func)
        return numba_typing(typingctx, targetctx, interp, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, event.install_recorder("numba:compile") as compiles:
        patch.setattr(typed_passes, "type_inference_stage", counting)
        answer = numba.njit(scope["top"])(5)
    compiled = [e.data["dispatcher"].py_func for _, e in compiles.buffer if e.is_start]
    return sum(f is scope["leaf"] for f in typed), compiled, answer


def test_an_inlined_rule_is_typed_once_and_never_compiled_alone():
    jit.prepare()
    scope = _rules()
    leaf_typed, compiled, answer = _compile_top(scope)
    assert answer == sum(x + 1 for base in (5, 6) for x in (base, base * 2, base * 3))
    assert compiled == [scope["top"]], "only the caller is compiled; what it inlines is not compiled on its own"
    assert leaf_typed == 1, "typed once, for the six places it is inlined (numba's own way: 53 times)"


def test_numba_s_own_way_types_the_leaf_more_often(monkeypatch):
    """The comparison that says what the first test saves (and that it would fail without it)."""
    jit.prepare()
    ours, _, answer = _compile_top(_rules())
    monkeypatch.setattr(_OverloadFunctionTemplate, "generic", _OverloadFunctionTemplate.generic.__wrapped__)
    numbas, compiled, numbas_answer = _compile_top(_rules())
    assert numbas_answer == answer
    assert numbas > 2 * ours and len(compiled) > 1


def test_a_rule_with_a_default_is_left_to_numba_and_gives_the_same_answer():
    jit.prepare()
    scope: dict = {}
    exec("def leaf(x, step=1):\n    return x + step\n\ndef top(x):\n    return leaf(x) + leaf(x, 2)\n", scope)
    register_jitable(_nrt=False, inline="always")(scope["leaf"])
    assert numba.njit(scope["top"])(5) == 13
