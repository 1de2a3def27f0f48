"""The simulated kind: a stand-in device for cluster experiments, with no weights and no torch.

SIMULATION (workers/runtimes/sim_runtime.py): loading sleeps the spec's
`load_seconds`, forward batches sleep their modelled cost, and vectors are
pseudo-random unit vectors of each text. It embeds as a dense embedder does
(the ``embed`` operation, `shoal embed`, ``/v1/encode``), and runs ``sim``
items, which carry token counts instead of rows (benchmarks/pull_vs_push.py).
It is never recognised from files: a catalog entry names it. Its fingerprint
is its name.
"""

from __future__ import annotations

from .kind import Kind

OPERATIONS = "shoal.workers.operations"

KIND = Kind(
    name="sim",
    command="embed",
    operations={"embed": f"{OPERATIONS}.embed_operation", "sim": f"{OPERATIONS}.sim_operation"},
    api="embed",
    runtimes={"torch": "shoal.workers.runtimes.sim_runtime:SimulatedRuntime"},
    options=frozenset({"chunk", "vectors", "prompt"}),
    simulated=True,
)
