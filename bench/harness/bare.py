"""The baseline the read path is compared against: aiohttp with one GET handler answering
constant bytes (a real top-10 answer's), no middleware, no access log: one aiohttp process'
ceiling on this box. `python -m bench.harness.bare PORT BODY_FILE` serves it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.harness.probes import HOST, wait_ready
from bench.harness.processes import Child, Children
from rankstream.stack import free_port


def start_bare(group: Children, body: bytes) -> tuple[Child, str]:
    """The bare app in a process of its own, answering `body` to every GET /; (it, its base URL)."""
    body_file = group.folder / "bare_body.json"
    body_file.write_bytes(body)
    port = free_port()
    child = group.spawn("bare", [sys.executable, "-m", "bench.harness.bare", str(port), str(body_file)])
    base = f"http://{HOST}:{port}"
    wait_ready(child, f"{base}/")
    return child, base


def serve_bare(port: int, body_file: Path) -> None:
    from aiohttp import web  # noqa: PLC0415 - the helper process only

    body = body_file.read_bytes()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/", handler)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None)


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness.bare", description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("body_file", type=Path)
    args = parser.parse_args(argv)
    serve_bare(args.port, args.body_file)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
