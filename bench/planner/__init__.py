"""The planner table: what ``accudnn plan`` predicts for real models at shrinking budgets.

``python -m bench.planner`` (:mod:`bench.planner.cli`) traces each model as the CLI does
(:mod:`bench.planner.cases`), plans it under every policy at budgets of static bytes plus a
fraction of the saved activations (:mod:`bench.planner.table`), and writes the JSON and a
markdown table under ``bench/results/cpu/``. ``python -m bench.planner.speed`` times the CLI
itself (import, trace, search), in fresh processes; ``python -m bench.planner.plan_time`` times
the planning of every cell of the table, against another checkout, and checks that both make
the same plans.
"""
