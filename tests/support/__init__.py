"""What the tests share besides fixtures, imported as `from tests.support.<module> import ...`.

One concept per module: `paths` (the repository and the commands), `waiting` (`wait_for`, never a fixed
sleep), `files` (Parquet shards, outputs, profiles), `cli` (a `shoal` command in this process or its own),
`s3` (the moto server's options), `models` (tiny models with random weights), `fake_scheduler` (the
scheduler plugin driven in-process, for unit tests, and `spec`, a valid model spec), `dask_cli` (a cluster of `dask` CLI processes) and
`worker_loss` (killing a worker mid-job). The fixtures are in `tests/fixtures/`, the tiers in `tests/conftest.py`.
"""
