"""Who did an operator's action and why: one value that every operator service builds from its `by` and `reason`.

Audit.of refuses a blank reason (ServiceError reason_required, naming the action); payload() is the by / who / why
every such action journals (who and by are the same person, both kept: readers of older rows use either).
"""

from dataclasses import dataclass
from typing import Any

from .errors import ServiceError


@dataclass(frozen=True)
class Audit:
    by: str
    why: str

    @classmethod
    def of(cls, *, by: str, reason: str, action: str) -> "Audit":
        """The audit of `action` ("a cancel", "a retry" ...); refused when the reason is blank."""
        if not reason or not reason.strip():
            raise ServiceError(f"{action} needs a reason", code="reason_required")
        return cls(by=by, why=reason)

    def because(self, why: str) -> "Audit":
        """The same person, another reason (what an action does to the runs below its target, say)."""
        return Audit(by=self.by, why=why)

    def payload(self, **more: Any) -> dict[str, Any]:
        """{"by", "who", "why"} and what the action adds, for its journal row."""
        return {"by": self.by, "who": self.by, "why": self.why, **more}
