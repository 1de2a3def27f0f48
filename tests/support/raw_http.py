"""HTTP as raw bytes on a socket: the requests no client library would send (bad framing, bad encodings, no Host)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes
    raw: bytes  # everything the server sent, interim answers (100 Continue) included

    @property
    def error(self) -> dict[str, Any]:
        """The JSON error shape's `error` (fails when the answer is not in it)."""
        assert self.headers.get("content-type", "").startswith("application/json"), self.raw[:500]
        return json.loads(self.body)["error"]


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:  # the server closed with unread bytes of ours: what it sent first still counts
        pass
    return b"".join(chunks)


def parse(raw: bytes) -> Answer:
    """The final answer in `raw` (after any 1xx)."""
    rest = raw
    while rest.startswith(b"HTTP/1.1 1"):
        rest = rest.split(b"\r\n\r\n", 1)[1]
    head, _, body = rest.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)}
    return Answer(int(lines[0].split(" ", 2)[1]), headers, body, raw)


def request_bytes(
    method: str, path: str, body: bytes = b"", headers: dict[str, str | bytes] | None = None, host: bool = True
) -> bytes:
    """An HTTP/1.1 request closing its connection; Content-Length unless `headers` frame the body otherwise."""
    head: dict[str, str | bytes] = {"Connection": "close"}
    if host:
        head = {"Host": "shoal", **head}
    given = {k.lower() for k in headers or {}}
    if "transfer-encoding" not in given and "content-length" not in given and (body or method == "POST"):
        head["Content-Length"] = str(len(body))
    head.update(headers or {})
    lines = [f"{method} {path} HTTP/1.1".encode()]
    lines += [k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()) for k, v in head.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(port: int, raw: bytes, timeout: float = 60) -> Answer:
    """Send `raw` to 127.0.0.1:`port`, read until the server closes: its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
        except (BrokenPipeError, ConnectionResetError):  # refused before all was sent: its answer is still there
            pass
        return parse(read_until_closed(sock))
