"""The host cost of the AccUDNN strategy per training step, measured on the CPU.

``python -m bench.overhead`` (about three minutes on a shared 2-core machine; ``--quick``
for the CI check) prints and writes under ``bench/results/cpu/``: microseconds per module
call, per kept and per swapped saved tensor (above the floor of a bare
``torch.autograd.graph.saved_tensors_hooks`` pair, measured too), per parameter, full
garbage collections per 100 steps, the step-time ratio against Lightning's default strategy
for a deep narrow model, and the host milliseconds the strategy adds to ResNet-152- and
GPT-2-medium-structured models at tiny sizes, as a share of the H100 step the planner
predicts for the real sizes. ``bench/README.md`` says how each figure is obtained.
"""
