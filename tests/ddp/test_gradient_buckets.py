"""DDP's gradient buckets are model-state memory when they are a second copy of the gradients."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.gradient_buckets import gradient_bucket_bytes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    model[2].bias.requires_grad_(False)  # frozen: DDP does not reduce it
    return model


def test_bucket_bytes_count_the_reduced_gradients_unless_they_are_views(one_rank_group):
    trained = sum(p.nbytes for p in _model().parameters() if p.requires_grad)
    assert gradient_bucket_bytes(DistributedDataParallel(_model(), gradient_as_bucket_view=False)) == trained
    assert gradient_bucket_bytes(DistributedDataParallel(_model(), gradient_as_bucket_view=True)) == 0
    assert gradient_bucket_bytes(_model()) == 0


def test_session_static_memory_includes_the_buckets(one_rank_group):
    model = _model()
    wrapper = DistributedDataParallel(model, gradient_as_bucket_view=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu")
    session.count_gradient_buckets(wrapper)
    with session.step(model, optimizer, batch=torch.zeros(4, 32)):
        loss = wrapper(torch.randn(4, 32)).sum()
    loss.backward()
    expected = model_state_bytes(model, [optimizer]) + gradient_bucket_bytes(wrapper)
    assert session.engine.ledger.static_bytes == expected
    assert session.gradient_bucket_bytes > 0
    session.close()
