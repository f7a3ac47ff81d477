"""The offload session: the adaptive loop (profile, plan, run, measure, re-plan), Lightning-free.

Imports torch, ``ops`` and ``planner`` only, so a plain PyTorch loop and Lightning Fabric use
it directly; the Lightning strategies are glue around one session each.

Example:
    >>> from lightning_accudnn.session import OffloadConfig, OffloadSession
    >>> OffloadConfig(budget="12GB").min_swap_bytes
    1048576
"""

from lightning_accudnn.session.config import OffloadConfig, default_reserve_bytes
from lightning_accudnn.session.distributed import DistributedCoordinator, merge_profiles
from lightning_accudnn.session.patterns import UnmatchedPatternError, check_keep_on_device
from lightning_accudnn.session.plan_book import PassKey, PlanBook, PlanSource, batch_signature
from lightning_accudnn.session.session import OffloadSession
from lightning_accudnn.session.stats import OffloadStats

__all__ = [
    "DistributedCoordinator",
    "OffloadConfig",
    "OffloadSession",
    "OffloadStats",
    "PassKey",
    "PlanBook",
    "PlanSource",
    "UnmatchedPatternError",
    "batch_signature",
    "check_keep_on_device",
    "default_reserve_bytes",
    "merge_profiles",
]
