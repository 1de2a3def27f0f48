"""One run of a job at a time: a lock object with an owner and an expiry.

The lock lives beside the output (``OUTPUT/_lock.json``), so it works for
every process that can write the output, on any fsspec store. Object stores
offer no portable create-if-absent, so taking the lock is: read it; if
another owner holds it unexpired, give up; else write our record, wait
`settle_seconds`, read it back, and hold it only if it is still ours (of two
racing writers, both read back the last write, so only one goes on). The
holder renews the expiry every third of `expiry_seconds` from a thread; the
lock of a run that died lapses after `expiry_seconds`.

Limits: two takers whose read and write straddle the other's whole settle
window can both win, which needs a pause longer than `settle_seconds`
between one read and the following write; expiry compares wall clocks, so
hosts need roughly synchronized clocks; a holder stalled past its expiry
loses the lock, notices at its next renewal (`lost`) and must not publish.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from typing import TypedDict

from ...scheduler_plugins.protocol import StorageOptions
from ...workers.data.storage import atomic_write, open_fs


class LockRecord(TypedDict, total=False):
    """The lock object: who holds it and until when (a torn or foreign file reads as expired)."""

    owner: str
    job: str
    host: str
    pid: int
    expires: float  # seconds since the epoch; renewed while the run lasts


class LockHeld(RuntimeError):
    """Another run of the job holds the lock."""


class JobLock:
    def __init__(
        self,
        url: str,
        storage_options: StorageOptions | None = None,
        expiry_seconds: float = 300.0,
        settle_seconds: float = 1.0,
        job: str = "",
    ) -> None:
        self.url = url
        self.storage_options = storage_options
        self.expiry_seconds = expiry_seconds
        self.settle_seconds = settle_seconds
        self.job = job
        self.owner = uuid.uuid4().hex
        self.lost = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self) -> None:
        held = self.read()
        if self._foreign(held):
            raise LockHeld(self.describe(held))
        self._write()
        time.sleep(self.settle_seconds)
        held = self.read()
        if held is None or held.get("owner") != self.owner:
            raise LockHeld(self.describe(held))
        self._renewer = threading.Thread(target=self._renew, name="shoal-lock-renewal", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        held = self.read()
        if held is not None and held.get("owner") == self.owner:
            fs, path = open_fs(self.url, self.storage_options)
            fs.rm_file(path)

    def __enter__(self) -> JobLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def read(self) -> LockRecord | None:
        fs, path = open_fs(self.url, self.storage_options)
        try:
            return json.loads(fs.cat_file(path))
        except FileNotFoundError:
            return None
        except ValueError:  # a torn or foreign file: treat as expired
            return {"owner": "?", "expires": 0}

    def describe(self, held: LockRecord | None) -> str:
        if held is None:
            return f"lost the race for the lock {self.url}; another run of job {self.job!r} took it"
        until = dt.datetime.fromtimestamp(held.get("expires", 0)).isoformat(timespec="seconds")
        return (
            f"job {held.get('job') or self.job!r} is already running on {held.get('host')} (pid {held.get('pid')}); "
            f"its lock {self.url} expires at {until} unless renewed. If that run died, wait until then "
            f"or delete the lock object."
        )

    def _foreign(self, held: LockRecord | None) -> bool:
        return held is not None and held.get("owner") != self.owner and held.get("expires", 0) > time.time()

    def _write(self) -> None:
        record: LockRecord = {
            "owner": self.owner,
            "job": self.job,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "expires": time.time() + self.expiry_seconds,
        }
        atomic_write(self.url, json.dumps(record).encode(), self.storage_options)

    def _renew(self) -> None:
        while not self._stop.wait(self.expiry_seconds / 3):
            try:
                held = self.read()
                if held is None or held.get("owner") != self.owner:
                    self.lost = True
                    return
                self._write()
            except OSError:  # storage hiccup: try again at the next renewal, well before expiry
                continue
