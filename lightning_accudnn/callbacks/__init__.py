"""The efficiency tuner: the batch size with the highest measured throughput, and a matching learning rate.

Example:
    >>> from lightning_accudnn.callbacks import EfficiencyTuner, LinearWarmup
    >>> tuner = EfficiencyTuner(warmup_epochs=1)
    >>> LinearWarmup(steps=2, start_factor=0.5)(1)
    0.75
"""

from lightning_accudnn.callbacks.batch_search import (
    NoBatchSizeFitsError,
    Prediction,
    SearchResult,
    Trial,
    candidate_batch_sizes,
    choose_batch_size,
    search_batch_size,
)
from lightning_accudnn.callbacks.decision import TunerDecision
from lightning_accudnn.callbacks.efficiency_tuner import EfficiencyTuner
from lightning_accudnn.callbacks.lr_scaling import LinearWarmup, WarmupOverlay, lr_factor, rule_for
from lightning_accudnn.callbacks.schedules import rescale_step_counts, scale_learning_rates

__all__ = [
    "EfficiencyTuner",
    "LinearWarmup",
    "NoBatchSizeFitsError",
    "Prediction",
    "SearchResult",
    "Trial",
    "TunerDecision",
    "WarmupOverlay",
    "candidate_batch_sizes",
    "choose_batch_size",
    "lr_factor",
    "rescale_step_counts",
    "rule_for",
    "scale_learning_rates",
    "search_batch_size",
]
