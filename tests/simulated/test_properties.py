"""Property tests on a simulated GPU: random models, schedules and lags.

For every draw: gradients bitwise equal to plain autograd, no happens-before violation, the
host pool back to zero in use after each step, the allocator model seeing exactly the blocks
the ledger counts, and device memory (ledger and allocator peaks) equal to the lag-0 run's,
so that it is a function of the model and the schedule only, as the planner assumes.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_accudnn.ops import SwapSchedule
from lightning_accudnn.testing import SimulatedGPU
from tests.models import loss_of
from tests.simulated.helpers import compare
from tests.simulated.random_models import PIECES, RandomNet, random_batch

pieces = st.lists(st.sampled_from(sorted(PIECES)), min_size=1, max_size=4)
windows = st.sampled_from([0, 256, 2**12, 2**40])
limits = st.sampled_from([None, 0, 512, 2**12, 2**40])
lags = st.one_of(st.integers(min_value=0, max_value=12), st.none())


@st.composite
def schedules(draw, layer_count):
    window, limit = draw(windows), draw(limits)
    if draw(st.booleans()):
        return SwapSchedule.swap_everything(window, limit)
    names = ["stem", "head", *(f"body.{i}" for i in range(layer_count))]
    chosen = draw(st.lists(st.sampled_from(names), unique=True))
    return SwapSchedule.swap_layers_named(chosen, window, limit)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), model_pieces=pieces, lag=lags, seed=st.integers(0, 2**16))
def test_random_models_schedules_and_lags(data, model_pieces, lag, seed):
    schedule = data.draw(schedules(len(model_pieces)))
    batches = [random_batch(seed), random_batch(seed + 1)]

    def make_model():
        return RandomNet(model_pieces)

    reference = SimulatedGPU(lag=0)
    reference_run = compare(make_model, batches, loss_of, schedule, reference)
    gpu = SimulatedGPU(lag=lag, seed=seed)
    run = compare(make_model, batches, loss_of, schedule, gpu)

    assert reference.violations == [] and gpu.violations == []
    assert run.ledger_peaks == run.held_peaks
    assert run.ledger_peaks == reference_run.ledger_peaks
    assert gpu.peak_bytes == reference.peak_bytes
    assert gpu.num_ooms == 0
