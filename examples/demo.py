"""Train a torchvision ResNet on synthetic data under a memory budget that forces swapping.

Runs on a GPU when there is one and on the CPU otherwise (where activations really move
through the host-copy backend, but no memory is saved). Prints the swap plan and what
each step swapped.

    python examples/demo.py --budget 170MB --steps 6

Defaults: on CPU 64x64 images under a 170MB budget (the model state with SGD momentum
takes 140MB); on a GPU 224x224 images under 1GB (plain training peaks at 913 MB allocated on
an H100; the strategy keeps a 256 MiB reserve for workspaces and fragmentation on CUDA).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

from lightning_accudnn import AccUDNNStrategy


class ResNetClassifier(LightningModule):
    def __init__(self, classes: int = 10, lr: float = 0.05) -> None:
        super().__init__()
        self.model = resnet18(num_classes=classes)
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self.model(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class PrintSwapping(Callback):
    """Prints the plan once it exists and what every step moved."""

    def on_train_batch_end(
        self, trainer: Trainer, module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        strategy = trainer.strategy
        stats = strategy.stats
        if batch_idx == 1 and strategy.plan is not None:
            print(strategy.plan)
        print(
            f"step {batch_idx}: {'profiling (swap all)' if stats.profiling else 'planned'} | "
            f"swapped out {stats.bytes_swapped_out / 1e6:.1f} MB, in {stats.bytes_swapped_in / 1e6:.1f} MB | "
            f"layers swapped {stats.swapped_layers} | peak {stats.peak_device_bytes / 1e6:.1f} MB | "
            f"waited {stats.wait_seconds * 1e3:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = torch.cuda.is_available()
    parser.add_argument(
        "--budget",
        default="1GB" if on_gpu else "170MB",
        help='device memory budget, e.g. "170MB", "8GB", "80%%"',
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224 if on_gpu else 64)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    seed_everything(0)
    samples = args.batch_size * args.steps
    images = torch.randn(samples, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 10, (samples,))
    data = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size)

    trainer = Trainer(
        accelerator="gpu" if on_gpu else "cpu",
        devices=1,
        strategy=AccUDNNStrategy(budget=args.budget),
        max_steps=args.steps,
        callbacks=[PrintSwapping()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(ResNetClassifier(), train_dataloaders=data)


if __name__ == "__main__":
    main()
