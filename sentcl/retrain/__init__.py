"""Retraining on new domain text: one procedure that the retrain flow, the benchmarks and the command line run.

``config`` reads params.yaml ``retrain:`` once (the method, the held-out share, what its runs train with over
``transfer:``); ``agreement`` holds the held-out share out and scores pairs among it with the teacher (the
label-free selection set); ``plan`` decides the runs, the selection data and the teacher check; ``run`` executes a
plan with a runner that runs each stage (a Prefect task in the flow, a subprocess in a benchmark) and says what
the retrain found. The flow adds only what is Prefect's and MLflow's: the inbox, retries, the gate.
"""
