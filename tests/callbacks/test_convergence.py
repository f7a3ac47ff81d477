"""Training at the tuned batch with the matched learning rate keeps the baseline's accuracy."""

import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch import LightningModule
from torch import nn

from lightning_accudnn import EfficiencyTuner
from tests.callbacks.helpers import VirtualClock, peaked, tuner_trainer

CLASSES, FEATURES = 4, 16


def blobs(samples: int, seed: int) -> torch.utils.data.TensorDataset:
    """Four overlapping Gaussian classes: about 93% is the best any classifier gets."""
    means = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(1234)) * 0.8
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, CLASSES, (samples,), generator=generator)
    return torch.utils.data.TensorDataset(
        means[targets] + torch.randn(samples, FEATURES, generator=generator), targets
    )


class BlobClassifier(LightningModule):
    def __init__(self, batch_size: int = 16, lr: float = 0.05, clock=None, curve=None) -> None:
        super().__init__()
        self.batch_size, self.lr, self.clock, self.curve = batch_size, lr, clock, curve
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        if self.clock is not None:
            self.clock.advance(self.curve(inputs.shape[0]))
        return F.cross_entropy(self.net(inputs), targets)

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.accuracy.update(self.net(inputs), targets)
        self.log("val_acc", self.accuracy, on_epoch=True)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(blobs(2000, seed=0), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(blobs(8000, seed=1), batch_size=2000)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def _val_accuracy(model: BlobClassifier, tuner: EfficiencyTuner | None) -> float:
    torch.manual_seed(0)
    trainer = tuner_trainer(tuner, max_steps=-1, max_epochs=6)
    trainer.fit(model)
    return float(trainer.callback_metrics["val_acc"])


@pytest.mark.filterwarnings("ignore:EfficiencyTuner. the strategy")
@pytest.mark.slow
def test_tuned_batch_with_matched_learning_rate_reaches_the_baseline_accuracy():
    torch.manual_seed(0)
    baseline = _val_accuracy(BlobClassifier(batch_size=16, lr=0.05), tuner=None)

    clock = VirtualClock()
    torch.manual_seed(0)
    model = BlobClassifier(batch_size=16, lr=0.05, clock=clock, curve=peaked(best=64))
    tuner = EfficiencyTuner(clock=clock, warmup_epochs=1)
    tuned = _val_accuracy(model, tuner)

    assert model.batch_size == 64 and tuner.decision.lr_factors == [4.0]
    assert model.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.2)
    assert baseline > 0.85  # the baseline learned the task
    assert tuned >= baseline - 0.01
