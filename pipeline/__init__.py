"""Shoal's client side: the `shoal` command and the public Python client.

- `cli`: the `shoal` command group; its commands in `cli_batch` (embed, rerank, reindex, run, eval),
  `cli_online` (status, serve, gateway, models) and `cli_tuning` (tune, check-precision); the options
  they share and the user-error exit in `cli_options`.
- `cluster`: reaching a scheduler or starting the embedded one.
- `jobs/`: batch jobs (embed, rerank), their planning, manifests, resume, reindex.
- `retrieval/`: `shoal run` and `shoal eval`.
- `tuning/`: `shoal tune` and the quality gate.
- `client`: `OnlineClient` and `AsyncOnlineClient`, the online endpoint's Python clients.
- `serve`, `gateway_process`, `status`, `model_listing`: what `shoal serve`, `gateway`, `status` and `models` run.
"""
