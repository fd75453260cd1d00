"""A policy that fails in the middle of a run: what docs/errors.md shows specbatch answer."""

from policies import Policy


class FailsMidRun(Policy):
    """Speculates k = 2 for a few steps, then raises, as a bug in a user's policy would."""

    max_k = 2

    def __init__(self) -> None:
        self.steps = 0

    def choose_k(self, view):
        self.steps += 1
        if self.steps > 3:
            raise ZeroDivisionError("a bug in the user's policy")
        return 2
