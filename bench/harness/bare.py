"""The baseline the read path is compared against: aiohttp with one GET handler answering
constant bytes (a real top-10 answer's), no middleware, no access log: one aiohttp process'
ceiling on this box. `python -m bench.harness.bare PORT BODY_FILE [--uvloop] [--redis URL]`
serves it (--uvloop: on uvloop's event loop, as `rankstream api` runs; --redis: on uvloop, each
request first makes one Redis round trip, a GET, on the API's own pipelined connection
(common/store/pipe.py): the ceiling of any read that asks Redis, with nothing of rankstream's
own in the way)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.harness.probes import HOST, wait_ready
from bench.harness.processes import Child, Children
from rankstream.stack import free_port


def have_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def start_bare(group: Children, body: bytes, *, uvloop: bool = False, redis: str = "") -> tuple[Child, str]:
    """The bare app in a process of its own, answering `body` to every GET /; (it, its base URL)."""
    body_file = group.folder / "bare_body.json"
    body_file.write_bytes(body)
    port = free_port()
    argv = [sys.executable, "-m", "bench.harness.bare", str(port), str(body_file)]
    name = "bare-redis" if redis else "bare-uvloop" if uvloop else "bare"
    child = group.spawn(
        name, [*argv, *(["--uvloop"] if uvloop else []), *(["--redis", redis] if redis else [])]
    )
    base = f"http://{HOST}:{port}"
    wait_ready(child, f"{base}/")
    return child, base


def serve_bare(port: int, body_file: Path, *, uvloop: bool = False, redis: str = "") -> None:
    from aiohttp import web  # noqa: PLC0415 - the helper process only

    from common.store.pipe import RedisPipe  # noqa: PLC0415 - the helper process only

    body = body_file.read_bytes()
    pipe = RedisPipe(redis) if redis else None

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    async def after_redis(request: web.Request) -> web.Response:
        assert pipe is not None
        await pipe.send("GET", "bare")
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/", after_redis if redis else handler)
    if uvloop or redis:
        import uvloop as uv  # noqa: PLC0415 - optional

        web.run_app(app, host=HOST, port=port, access_log=None, print=None, loop=uv.new_event_loop())
    else:
        web.run_app(app, host=HOST, port=port, access_log=None, print=None)


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness.bare", description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("body_file", type=Path)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    parser.add_argument("--redis", default="", help="a Redis URL: one GET per request first")
    args = parser.parse_args(argv)
    serve_bare(args.port, args.body_file, uvloop=args.uvloop, redis=args.redis)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
