"""Budgets for the GPU tests, read off a plan made at an ample budget.

On CUDA a plan counts the working memory the caching allocator measured (activation gradients,
cuDNN workspaces, the loss's temporaries) besides the saved activations, and its smallest budget
holds the profiling pass's measured peak (every activation swapped): a budget made of the model
state and a share of the saved activations alone can be below what any plan needs."""

from __future__ import annotations

from lightning_accudnn.planner import Plan


def halfway_budget(plan: Plan) -> int:
    """Halfway between ``plan``'s smallest budget and what keeping everything needs (its
    predicted peak with everything kept, plus its reserve): a budget that holds the step only
    with some activations offloaded. ``plan`` is one made at an ample budget, that kept
    everything."""
    assert not plan.swapped_layers and not plan.recomputed, "the ample budget should keep everything"
    kept = plan.predicted_peak_bytes + plan.reserve_bytes
    assert plan.min_budget_bytes < kept, (
        f"nothing to offload: the smallest budget {plan.min_budget_bytes} B is not below the "
        f"{kept} B that keeping everything needs"
    )
    return (plan.min_budget_bytes + kept) // 2
