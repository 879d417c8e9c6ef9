"""HTTP caching of read answers (docs/http-api.md#caching): what `Cache-Control` each answer
carries, its `ETag`, and the 304 an `If-None-Match` that still matches gets.

An ETag names one answer exactly: a digest of the request's canonical form (its path and the
parameters its route reads, in one order, so parameter order and unknown parameters do not
matter), the window period it resolved to (a clock-chosen period changes with the clock), the
previous period a `trend=1` answer read, where it was read (memory or Redis: the bodies say so)
and the board's seq (each shard's, for a hot sharded board), which changes with every change of
the board. Two answers with the same ETag have the same body, on any node."""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b
from urllib.parse import urlencode

from aiohttp import web

NO_STORE = "no-store"


def cache_control(max_age_s: int, stale_s: int, *, private: bool = False) -> str:
    scope = "private" if private else "public"
    return f"{scope}, max-age={max_age_s}, stale-while-revalidate={stale_s}"


def canonical(request: web.Request, params: Iterable[str]) -> str:
    """The request's path as sent (percent-encoded: `a%2Fb` is one member, `a/b` a route) and the
    parameters of `params` (sorted) it carries, first value each, encoded again."""
    query = request.query
    return (
        request.rel_url.raw_path + "?" + urlencode([(name, query[name]) for name in params if name in query])
    )


def etag(canonical_form: str, instance: str, previous: str, source: str, seqs: Iterable[int]) -> str:
    text = "\0".join((canonical_form, instance, previous, source, ".".join(map(str, seqs))))
    return '"' + blake2b(text.encode(), digest_size=12).hexdigest() + '"'


def matches(request: web.Request, tag: str) -> bool:
    """Whether the request's If-None-Match names `tag` (weakly, as RFC 9110 compares them)."""
    header = request.headers.get("If-None-Match")
    if not header:
        return False
    return header.strip() == "*" or any(t.strip().removeprefix("W/") == tag for t in header.split(","))


def headers(tag: str | None, control: str) -> dict[str, str]:
    """An answer's headers: built once for an answer that is kept."""
    found = {"Content-Type": "application/json", "Cache-Control": control}
    if tag is not None:
        found["ETag"] = tag
    return found


def respond(request: web.Request, body: bytes, held: dict[str, str]) -> web.Response:
    """The answer `body` with its `headers()`, or a 304 without a body if the caller holds it."""
    tag = held.get("ETag")
    if tag is not None and matches(request, tag):
        return web.Response(status=304, headers={k: v for k, v in held.items() if k != "Content-Type"})
    return web.Response(body=body, headers=held)
