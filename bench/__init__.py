"""`make bench`: PAL Ops side by side with DBOS Transact and bare Celery (docs/PERFORMANCE.md).

`python -m bench` runs every measurement in its own child process (`bench.child`), each in its own
process group with a time limit, and writes docs/PERFORMANCE.md (`bench.report`).

One module per side, each with the same two entry points:

- `per_step_overhead(steps, repeats)`: one run of `steps` no-op steps, `repeats` times; seconds per step.
- `throughput(runs, steps, workers)`: `runs` runs of `steps` no-op steps over `workers` worker processes; steps/s.

`bench.ours` is PAL Ops, `bench.peers_dbos` DBOS Transact, `bench.peers_celery` bare Celery.
`bench.api_load` is PAL Ops' REST API under uvicorn (scenarios E and F: wrk load, 500 open event streams).
Nothing here asserts a timing: a benchmark reports, it does not pass or fail.
"""
