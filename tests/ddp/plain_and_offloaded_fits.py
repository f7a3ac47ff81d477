"""Every DDP configuration trained twice in the same two ranks, once with Lightning's
DDPStrategy and once with AccUDNNDDPStrategy (swapping forced, or recomputation under policy
``"recompute"``); rank 0 prints whether the
weights are bitwise equal. Run by tests/ddp/launched_ranks.py (for tests/ddp/test_launched.py)
in its two ranks: the Trainers after the first find the process group already there and reuse
it, so the eight fits cost one launch instead of eight."""

import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_accudnn import AccUDNNDDPStrategy
from tests.models import Classifier, loader
from tests.strategy.helpers import memory_need, trainer_for


class PartlyUnused(Classifier):
    """A second head that gets no gradient: DDP needs find_unused_parameters for it."""

    def __init__(self):
        super().__init__("cnn")
        self.unused_head = torch.nn.Linear(16, 10)


CONFIGURATIONS = {
    "defaults": (Classifier, {}, {}),
    "static-graph-bucket-view": (Classifier, {"static_graph": True, "gradient_as_bucket_view": True}, {}),
    "accumulation-no-sync": (Classifier, {}, {"accumulate_grad_batches": 2}),
    "find-unused-parameters": (PartlyUnused, {"find_unused_parameters": True}, {}),
    "recompute": (Classifier, {}, {}, {"policy": "recompute"}),
    "recompute-static-graph": (Classifier, {"static_graph": True}, {}, {"policy": "recompute"}),
}

#: The budget's share of the activations of a batch of 4 (``memory_need``'s): 0.6, less than a
#: third of what a rank's batch of 8 saves, and above the least plan's need (it keeps the batch,
#: which the step holds); or under policy "recompute" (no budget below the swap-everything
#: profiling pass's peak is accepted) three halves, three quarters of what a rank's batch of 8
#: saves: only recomputation makes it fit.
SHARES = {"recompute": 1.5, "recompute-static-graph": 1.5}
SWAPPING_SHARE = 0.6


def differing_weights(model_class, ddp_options, trainer_options, accudnn_options=None, *, budget):
    torch.manual_seed(0)
    plain, swapped = model_class(), model_class()
    swapped.load_state_dict(plain.state_dict())
    trainer_for(DDPStrategy(**ddp_options), max_steps=4, devices=2, **trainer_options).fit(
        plain, loader("cnn", batches=8)
    )
    strategy = AccUDNNDDPStrategy(budget=budget, min_swap_bytes=0, **(accudnn_options or {}), **ddp_options)
    trainer = trainer_for(strategy, max_steps=4, devices=2, **trainer_options)
    trainer.fit(swapped, loader("cnn", batches=8))
    if accudnn_options:
        plan = trainer.strategy.plan
        if plan is None or not plan.recomputed:
            return ["(nothing was recomputed)"]
    elif not trainer.strategy.stats.bytes_swapped_out:
        return ["(nothing was swapped)"]
    pairs = zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True)
    return [name for (name, a), b in pairs if not torch.equal(a, b)]


def main() -> None:
    """Every configuration; rank 0 prints one verdict line per configuration."""
    static, saved = memory_need("cnn", batch_size=4)
    for name, configuration in CONFIGURATIONS.items():
        share = SHARES.get(name, SWAPPING_SHARE)
        differing = differing_weights(*configuration, budget=static + int(share * saved))
        if torch.distributed.get_rank() == 0:
            print(f"{name}: {'equal' if not differing else 'differs in ' + ', '.join(differing)}", flush=True)
