"""Where profiles come from, other than a live step: the measurements and models the planner is fed.

The planner (:mod:`lightning_accudnn.planner`) is pure, profile in and plan out; this
package makes profiles and the figures around them. It holds the FakeTensor dry-run trace
of a training step (:mod:`~lightning_accudnn.profiling.trace`) and what each kernel it records
costs (:mod:`~lightning_accudnn.profiling.kernels`), the roofline that times it
for a GPU (:mod:`~lightning_accudnn.profiling.roofline`) from the datasheet table
(:mod:`~lightning_accudnn.profiling.gpus`), the modelling of the kernels a CUDA device would
run in its place (:mod:`~lightning_accudnn.profiling.attention`,
:mod:`~lightning_accudnn.profiling.cuda_autocast`) and of what its allocator would hold
(:mod:`~lightning_accudnn.profiling.cuda_allocations`), the live host-link probe
(:mod:`~lightning_accudnn.profiling.bandwidth`) and the count of a model's static memory
(:mod:`~lightning_accudnn.profiling.static_memory`). Import the modules themselves: this
package's own import is empty, so that importing one of them does not import the others.

Example:
    >>> from lightning_accudnn.profiling.gpus import get_gpu
    >>> get_gpu("h100").name
    'H100 SXM 80GB'
"""
