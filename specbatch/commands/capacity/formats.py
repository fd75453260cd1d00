"""How capacity's reports write numbers, prices and policies (the aggregated and the disaggregated tables alike)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specbatch.commands.capacity.search import PolicyOutcome


def num_text(value: float | None, digits: int = 4) -> str:
    """A number for a table: ``digits`` significant, a dash for none or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}g}"


def money_text(value: float | None) -> str:
    """Dollars for a table, a dash for none."""
    return "—" if value is None else f"${value:,.2f}"


def policy_text(label: str, o: "PolicyOutcome") -> str:
    """A policy as a table names it: its label and the parameters the label does not say."""
    params = " ".join(f"{k}={v}" for k, v in o.config.policy.params.items()  # those the label does not say
                      if not isinstance(v, (list, dict)) and f":{k}=" not in label)
    return f"{label}" + (f" ({params})" if params else "")
