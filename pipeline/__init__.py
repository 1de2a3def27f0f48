"""Shoal's client side: the `shoal` command and the public Python client.

- `cli`: the `shoal` command; `cluster`: reaching a scheduler or starting the embedded one.
- `jobs/`: batch jobs (embed, rerank), their planning, manifests, resume, reindex.
- `retrieval/`: `shoal run` and `shoal eval`.
- `tuning/`: `shoal tune` and the quality gate.
- `client`: `OnlineClient` and `AsyncOnlineClient`, the online endpoint's Python clients.
- `serve`, `gateway_process`, `status`, `model_listing`: the commands of the same names.
"""
