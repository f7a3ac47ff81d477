"""The offload session: the adaptive loop (profile, plan, run, measure, re-plan), Lightning-free.

Imports torch, ``ops`` and ``planner`` only, so a plain PyTorch loop and Lightning Fabric use
it directly; the Lightning strategies are glue around one session each.

Example:
    >>> from lightning_accudnn.session import OffloadConfig, OffloadSession
    >>> OffloadConfig(budget="12GB").min_swap_bytes
    1048576
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_accudnn.lazy_names import lazy_names

if TYPE_CHECKING:
    from lightning_accudnn.session.config import OffloadConfig, default_reserve_bytes
    from lightning_accudnn.session.distributed import DistributedCoordinator, merge_profiles
    from lightning_accudnn.session.patterns import UnmatchedPatternError, check_keep_on_device
    from lightning_accudnn.session.plan_book import PassKey, PlanBook, PlanSource, batch_signature
    from lightning_accudnn.session.session import OffloadSession
    from lightning_accudnn.session.stats import OffloadStats

#: Each name, and the module that defines it: imported on first use, so that importing one
#: module of this package (``lightning_accudnn.session.<module>``) does not import the others.
_NAMES = {
    "OffloadConfig": "lightning_accudnn.session.config",
    "default_reserve_bytes": "lightning_accudnn.session.config",
    "DistributedCoordinator": "lightning_accudnn.session.distributed",
    "merge_profiles": "lightning_accudnn.session.distributed",
    "UnmatchedPatternError": "lightning_accudnn.session.patterns",
    "check_keep_on_device": "lightning_accudnn.session.patterns",
    "PassKey": "lightning_accudnn.session.plan_book",
    "PlanBook": "lightning_accudnn.session.plan_book",
    "PlanSource": "lightning_accudnn.session.plan_book",
    "batch_signature": "lightning_accudnn.session.plan_book",
    "OffloadSession": "lightning_accudnn.session.session",
    "OffloadStats": "lightning_accudnn.session.stats",
}


__getattr__, __dir__ = lazy_names(globals(), _NAMES)


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
