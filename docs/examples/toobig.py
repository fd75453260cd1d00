"""Three broken policies, for the errors docs/policies.md shows."""

from policies import BatchView, Policy


class TooBig(Policy):
    """Promises k <= 3, returns 5."""

    name = "too-big"
    max_k = 3

    def choose_k(self, view: BatchView) -> int:
        return 5


class Floaty(Policy):
    """Returns a float."""

    name = "floaty"
    max_k = 3

    def choose_k(self, view: BatchView) -> float:
        return 2.0


class Vague(Policy):
    """Never says its largest k."""

    name = "vague"

    def choose_k(self, view: BatchView) -> int:
        return 1
