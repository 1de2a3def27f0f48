"""A stand-in Hugging Face Hub on 127.0.0.1: the endpoints huggingface_hub's `snapshot_download` and `model_info`
call (huggingface_hub 2.4, read from its source), serving model folders published to it, and counting the files
it sends. Point a process at it with ``HF_ENDPOINT=hub.url`` (and ``HF_HUB_OFFLINE=0``: tests/conftest.py
sets it on for the test session).

- ``GET /api/models/ORG/NAME`` and ``/api/models/ORG/NAME/revision/REV``: the model's info, its ``sha``
  the commit REV names (`HfApi.repo_info`, `model_info`);
- ``GET /api/models/ORG/NAME/tree/COMMIT[/PATH]?recursive=...``: every file, ``type``, ``path``, ``size``
  and ``oid``, in one page (no ``Link`` header) (`HfApi.list_repo_tree`);
- ``HEAD`` and ``GET /ORG/NAME/resolve/REV/PATH``: a file, with the headers `get_hf_file_metadata` reads:
  ``X-Repo-Commit``, ``ETag`` and ``Content-Length`` (`hf_hub_download`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class StandInHub:
    """Repositories of commits (path -> bytes), each with a `main`; what was requested and sent."""

    def __init__(self) -> None:
        self.commits: dict[str, dict[str, dict[str, bytes]]] = {}  # repo -> commit -> files
        self.refs: dict[str, dict[str, str]] = {}  # repo -> ref -> commit
        self.sent: Counter[tuple[str, str, str]] = Counter()  # (repo, commit, path) -> file bodies sent
        self.requests: list[str] = []
        self.url = ""

    def publish(self, repo_id: str, folder: Path, ref: str = "main") -> str:
        """`folder`'s files as a new commit of `repo_id`, `ref` moved to it; the commit."""
        files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        digest = hashlib.sha1()
        for path, data in files.items():
            digest.update(path.encode() + b"\0" + hashlib.sha1(data).digest())
        commit = digest.hexdigest()
        self.commits.setdefault(repo_id, {})[commit] = files
        self.refs.setdefault(repo_id, {})[ref] = commit
        return commit

    def files_sent(self, commit: str | None = None) -> int:
        return sum(n for (_, c, _), n in self.sent.items() if commit is None or c == commit)

    def commit_of(self, repo_id: str, revision: str) -> str | None:
        if revision in self.commits.get(repo_id, {}):
            return revision
        return self.refs.get(repo_id, {}).get(revision)


def _oid(data: bytes) -> str:
    """A git blob's id, as the Hub lists a file that is not in LFS."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: StandInHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        self.hub.requests.append(f"{self.command} {self.path}")
        path = unquote(urlsplit(self.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            rest = parts[4:]
            if not rest or rest[0] == "revision":
                return self._info(repo_id, rest[1] if len(rest) > 1 else "main")
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo_id, rest[1], "/".join(rest[2:]))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)
        self._json(404, {"error": f"not found: {path}"}, {"X-Error-Code": "RepoNotFound"})

    def _info(self, repo_id: str, revision: str) -> None:
        commit = self.hub.commit_of(repo_id, revision)
        if commit is None:
            code = "RevisionNotFound" if repo_id in self.hub.commits else "RepoNotFound"
            return self._json(404, {"error": f"{repo_id}@{revision} not found"}, {"X-Error-Code": code})
        files = self.hub.commits[repo_id][commit]
        self._json(200, {"id": repo_id, "sha": commit, "private": False, "siblings": [{"rfilename": f} for f in files]})

    def _tree(self, repo_id: str, revision: str, under: str) -> None:
        commit = self.hub.commit_of(repo_id, revision)
        if commit is None:
            return self._json(404, {"error": f"{repo_id}@{revision} not found"}, {"X-Error-Code": "RevisionNotFound"})
        files = self.hub.commits[repo_id][commit]
        listed = [
            {"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
            for name, data in files.items()
            if not under or name.startswith(under.rstrip("/") + "/")
        ]
        self._json(200, listed)

    def _file(self, repo_id: str, revision: str, name: str, body: bool) -> None:
        commit = self.hub.commit_of(repo_id, revision)
        data = self.hub.commits.get(repo_id, {}).get(commit or "", {}).get(name)
        if commit is None or data is None:
            headers = {"X-Error-Code": "EntryNotFound", **({"X-Repo-Commit": commit} if commit else {})}
            return self._json(404, {"error": f"{repo_id}@{revision}: no {name}"}, headers, body)
        self.send_response(200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{_oid(data)}"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if body:
            self.wfile.write(data)
            self.hub.sent[repo_id, commit, name] += 1

    def _json(self, status: int, value, headers: dict[str, str] | None = None, body: bool = True) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        for name, header in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, header)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(data)


@contextmanager
def stand_in_hub() -> Iterator[StandInHub]:
    """A `StandInHub` listening on 127.0.0.1 (its `url`) until the block ends."""
    hub = StandInHub()
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="stand-in hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
