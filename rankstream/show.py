"""`rankstream top` and `rankstream member`: readable tables from a running API."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

from common.errors import RankstreamError


class ApiAnswerError(RankstreamError):
    """The API answered with an error (its code and message), or could not be reached."""


def api_url(api: str, path: str, params: dict[str, Any]) -> str:
    """`path` on the API at `api`, with the parameters that are set; an http(s) URL or ApiAnswerError."""
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    url = f"{api.rstrip('/')}{urllib.parse.quote(path)}" + (f"?{query}" if query else "")
    if not url.startswith(("http://", "https://")):
        raise ApiAnswerError(f"--api must be an http(s) URL, got {api!r}")
    return url


def error_line(exc: urllib.error.HTTPError, url: str) -> str:
    """The API's error as `code: message`, or the status when the body is no error of ours."""
    try:
        error = orjson.loads(exc.read())["error"]
        return f"{error['code']}: {error['message']}"
    except (orjson.JSONDecodeError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code} from {url}"


def fetch(api: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
    url = api_url(api, path, params)
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - api_url checked the scheme
            body: dict[str, Any] = orjson.loads(resp.read())
            return body
    except urllib.error.HTTPError as exc:
        raise ApiAnswerError(error_line(exc, url)) from None
    except OSError as exc:
        raise ApiAnswerError(f"cannot reach the API at {api}: {exc}") from None


def _name(item: dict[str, Any]) -> str:
    meta = item.get("meta")
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = {0, 2}  # rank and score read better right-aligned
    lines = []
    for row in [header, ["-" * w for w in widths], *rows]:
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def show_top(api: str, board: str, **params: Any) -> str:
    return top_table(fetch(api, f"/v1/boards/{board}/top", params))


def top_table(body: dict[str, Any]) -> str:
    """A top answer as a table, its board and period above, its source and seq below."""
    rows = [[str(i["rank"]), i["member"], str(i["score"]), _name(i)] for i in body["items"]]
    head = f"{body['board']}  window {body['window']}  period {body['period']}  members {body['total']}"
    foot = f"source {body['source']}  seq {body['seq']}"
    return "\n".join([head, table(rows, ["rank", "member", "score", "name"]), foot])


def show_member(api: str, board: str, member: str, **params: Any) -> str:
    body = fetch(api, f"/v1/boards/{board}/members/{member}", params)
    rows = [[str(body["rank"]), body["member"], str(body["score"]), _name(body)]]
    head = f"{body['board']}  window {body['window']}  period {body['period']}"
    return "\n".join(
        [
            head,
            table(rows, ["rank", "member", "score", "name"]),
            f"source {body['source']}  seq {body['seq']}",
        ]
    )
