"""A small HTTP server in a thread for the worker's probes and metrics (the API has its own routes)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Probe = Callable[[], tuple[bool, dict[str, object]]]


def serve_probes(
    host: str, port: int, live: Probe, ready: Probe, registry: CollectorRegistry
) -> ThreadingHTTPServer:
    """Serve /livez, /readyz and /metrics on (host, port) until `.shutdown()`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                return
            probe = {"/livez": live, "/readyz": ready}.get(self.path.split("?")[0])
            if probe is None:
                self._send(404, orjson.dumps({"error": {"code": "not_found", "message": self.path}}))
                return
            ok, detail = probe()
            self._send(200 if ok else 503, orjson.dumps({"ok": ok, **detail}))

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the structured log

    server = ThreadingHTTPServer((host, port), Handler)
    # a short poll interval: shutdown() waits for it, and it counts against the shutdown deadline
    threading.Thread(target=server.serve_forever, args=(0.05,), name="probes", daemon=True).start()
    return server
