"""Side-by-side benchmarks of lightning-accudnn against other ways to save activation memory.

``python -m bench.run --workload tiny --device cpu`` runs the whole harness in seconds;
``bench/README.md`` gives the GPU commands and what every column means.
"""
