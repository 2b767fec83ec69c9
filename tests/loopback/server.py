"""A scripted HTTP server on 127.0.0.1 that real SDK clients and CLIs talk to in tests.

Replies come from a FIFO queue (a `Reply`, or a function of the recorded request returning one),
then from an optional fallback function; every request is recorded with its headers and JSON body.

A `Reply` with `hold_s` behaves like a real rate limiter: for `hold_s` seconds after it was sent,
any request is answered with the same reply again and recorded as `early`. A test can therefore
check that a client honoured retry-after by counting requests, never by timing: a client that came
back too soon costs an extra request.
"""

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Reply", "Recorded", "LoopbackServer", "Responder"]


@dataclass
class Reply:
    """One HTTP response: JSON `body`, or `sse` events [(event, data)] sent as text/event-stream."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    sse: list[tuple[str, dict[str, Any]]] | None = None
    hold_s: float = 0.0


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    early: bool = False

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]


Responder = Callable[[Recorded], Reply]


class LoopbackServer:
    """Serves POSTs to `routes` from the script; other requests get 404. Use as a context manager."""

    def __init__(self, routes: Iterable[str], *, fallback: Responder | None = None) -> None:
        self.routes = frozenset(routes)
        self.fallback = fallback
        self.requests: list[Recorded] = []
        self._queue: list[Reply | Responder] = []
        self._lock = threading.Lock()
        self._hold_until = 0.0
        self._hold_reply: Reply | None = None
        self._closed = False
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        # A short poll keeps shutdown (once per test) from costing the default half second.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def enqueue(self, *replies: Reply | Responder) -> "LoopbackServer":
        with self._lock:
            self._queue.extend(replies)
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def posts(self) -> list[Recorded]:
        """Recorded requests to the scripted routes, in arrival order."""
        return [r for r in self.requests if r.method == "POST" and r.route in self.routes]

    def __enter__(self) -> "LoopbackServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _answer(self, request: Recorded) -> Reply:
        with self._lock:
            self.requests.append(request)
            if request.method != "POST" or request.route not in self.routes:
                return Reply(404, {"error": {"type": "not_found_error", "message": f"no route {request.path}"}})
            if self._hold_reply is not None and time.monotonic() < self._hold_until:
                request.early = True
                return self._hold_reply
            if self._queue:
                item = self._queue.pop(0)
            elif self.fallback is not None:
                item = self.fallback
            else:
                # x-should-retry: false stops the SDKs from retrying a script that simply ran out.
                return Reply(
                    500,
                    {"error": {"type": "loopback_error", "message": "loopback: no scripted reply left"}},
                    {"x-should-retry": "false"},
                )
        reply = item(request) if callable(item) else item
        if reply.hold_s > 0:
            with self._lock:
                # Measured before the reply is written: the client cannot see it any earlier.
                self._hold_until = time.monotonic() + reply.hold_s
                self._hold_reply = reply
        return reply

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return  # keep pytest output clean; requests are recorded instead

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = raw.decode("utf-8", errors="replace")
                recorded = Recorded(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
                reply = server._answer(recorded)
                if reply.sse is not None:
                    payload = "".join(
                        f"event: {event}\ndata: {json.dumps(data)}\n\n" for event, data in reply.sse
                    ).encode()
                    content_type = "text/event-stream"
                else:
                    payload = json.dumps(reply.body if reply.body is not None else {}).encode()
                    content_type = "application/json"
                self.send_response(reply.status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        self.wfile.write(payload)
                    except (BrokenPipeError, ConnectionResetError):
                        self.close_connection = True  # the client was killed mid-request (timeout tests)

            do_POST = _handle
            do_GET = _handle
            do_HEAD = _handle

        return Handler
