"""Train a torchvision ResNet with a plain PyTorch loop under a memory budget (no Lightning).

The session profiles the first step, plans, and re-plans when the batch shape changes; it
prints the plan and what each step swapped. Runs on a GPU when there is one, else on CPU
(activations really move through the host-copy backend there, but no memory is saved).

    python examples/plain_loop.py --budget 170MB --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torchvision.models import resnet18

from lightning_accudnn import OffloadConfig, OffloadSession


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--budget", default="1GB" if on_gpu else "170MB", help='e.g. "170MB", "8GB", "80%%"')
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224 if on_gpu else 64)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if on_gpu else "cpu")
    model = resnet18(num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with OffloadSession(OffloadConfig(budget=args.budget), device) as session:
        for step in range(args.steps):
            # The last step uses half the batch: a new shape, profiled and planned on its own.
            size = args.batch_size if step < args.steps - 1 else args.batch_size // 2
            images = torch.randn(size, 3, args.image_size, args.image_size, device=device)
            labels = torch.randint(0, 10, (size,), device=device)
            with session.step(model, optimizer):
                loss = F.cross_entropy(model(images), labels)
            loss.backward()  # the session measures and plans at the end of backward
            optimizer.step()
            optimizer.zero_grad()
            stats = session.stats
            if step == 1:
                print(session.plan)
            print(
                f"step {step} (batch {size}): {'profiling (swap all)' if stats.profiling else 'planned'} | "
                f"swapped out {stats.bytes_swapped_out / 1e6:.1f} MB | "
                f"peak {stats.peak_device_bytes / 1e6:.1f} MB"
            )


if __name__ == "__main__":
    main()
