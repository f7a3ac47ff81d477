"""The performance model: profiles in, swap plans out. Imports torch only, never ``ops``."""

from lightning_accudnn.planner.budget import ACCEPTED_FORMS, Budget, format_bytes
from lightning_accudnn.planner.profile import LayerProfile, StepProfile

__all__ = ["ACCEPTED_FORMS", "Budget", "LayerProfile", "StepProfile", "format_bytes"]
