"""What the runledger.client tests share: a real TCP proxy between the client and a live Daphne
that misbehaves the way networks and load balancers do, on request: answers 503 or 429 with
Retry-After itself, loses a response after the server committed it, kills the server at a chosen
moment, cuts open streams, or goes away for a while (`stop()` ... `start()`). Every request it sees
is recorded. And `logged`: a run's events as the server stored them."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledger.models import Run, Workspace
from ledger.reads import selectors


def logged(workspace: Workspace, run_id: str) -> list[dict[str, Any]]:
    """The run's events as the server stored them."""
    return selectors.events(Run.objects.get(workspace=workspace, run_id=run_id))


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)


@dataclass
class Fault:
    """What the proxy does to the next request of `method`: `status` answers it itself (with
    Retry-After `retry_after` when given); `drop` forwards it, waits for the whole answer, runs
    `action` and closes without a byte to the client; `kill` forwards it and runs `action` at once."""

    method: str
    status: int | None = None
    retry_after: str | None = None
    drop: bool = False
    kill: bool = False
    action: Callable[[], None] | None = None


class FaultyProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def stop(self) -> None:
        """An outage: connections are refused (the port closed) and open ones cut, until `start()`."""
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it: close alone does not
        except OSError:
            pass
        self._listener.close()
        self.cut()

    def start(self) -> None:
        """The end of the outage: the same port answers again."""
        self._listener = socket.create_server(("127.0.0.1", int(self.url.rsplit(":", 1)[1])))
        threading.Thread(target=self._accept, daemon=True).start()

    def add(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def requests(self, method: str | None = None, path_part: str = "") -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if (method is None or s.method == method) and path_part in s.path]

    def cut(self) -> None:
        """Close every open connection (an open stream ends as if the network went away)."""
        with self._lock:
            sockets, self._open = set(self._open), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        listener = self._listener
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._open.update(sockets)

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream: socket.socket | None = None
        try:
            head, body = _read_request(client)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            with self._lock:
                self.seen.append(Seen(method, path, headers))
                fault = next((f for f in self.faults if f.method == method), None)
                if fault is not None:
                    self.faults.remove(fault)
            if fault is not None and fault.status is not None:
                text = b'{"error": {"code": "unavailable", "message": "the proxy says: later", "details": {}}}'
                retry = f"Retry-After: {fault.retry_after}\r\n" if fault.retry_after is not None else ""
                client.sendall(
                    f"HTTP/1.1 {fault.status} Busy\r\nContent-Type: application/json\r\n{retry}"
                    f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n".encode()
                    + text
                )
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30)
            except OSError:
                return  # the server is down: the client sees its connection closed
            self._track(upstream)
            kept = [line for line in lines[1:] if line and not line.lower().startswith("connection:")]
            upstream.sendall("\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1") + body)
            if fault is not None and fault.kill:
                assert fault.action is not None
                fault.action()
                return
            if fault is not None and fault.drop:
                while upstream.recv(65536):
                    pass  # the whole answer: the server has committed and replied
                if fault.action is not None:
                    fault.action()
                return
            upstream.settimeout(None)
            while chunk := upstream.recv(65536):
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._open.discard(sock)
                    sock.close()


def _read_request(sock: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body
