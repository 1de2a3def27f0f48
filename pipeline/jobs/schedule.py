"""Running a job on a cron expression, for `shoal reindex --schedule`.

Runs are sequential in this process (the next time is computed after a run
ends, so an overrun skips the slots it covered instead of queueing them),
and the job's lock keeps runs in other processes out. A run that fails is
logged and the loop goes on to the next slot.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

logger = logging.getLogger("shoal.schedule")


def check_expression(expression: str) -> None:
    """Raise ValueError for an expression croniter cannot use (5 fields, or 6 with seconds)."""
    from croniter import croniter  # here, not at the top: importing it runs `file` (platform.architecture)

    if not croniter.is_valid(expression):
        raise ValueError(f"not a valid cron expression: {expression!r}")


def next_run(expression: str, after: dt.datetime) -> dt.datetime:
    from croniter import croniter

    return croniter(expression, after).get_next(dt.datetime)


def run_on_schedule(expression: str, run: Callable[[], int], runs: int | None = None) -> int:
    """Call `run` at every slot of `expression` (local time); returns how many runs failed.

    `run` returns an exit code; an exception or a non-zero code counts as a
    failed run. `runs` stops the loop after that many runs (None: forever).
    """
    check_expression(expression)
    done = failed = 0
    while runs is None or done < runs:
        when = next_run(expression, dt.datetime.now().astimezone())
        logger.info("next run at %s", when.isoformat(timespec="seconds"))
        time.sleep(max(0.0, when.timestamp() - time.time()))
        done += 1
        started = time.monotonic()
        logger.info("run %d started", done)
        try:
            code = run()
        except Exception as exc:  # a failed run never ends the schedule
            failed += 1
            logger.error("run %d failed after %.1fs: %s: %s", done, time.monotonic() - started, type(exc).__name__, exc)
            continue
        if code:
            failed += 1
        logger.info("run %d finished with exit code %d after %.1fs", done, code, time.monotonic() - started)
    return failed
