"""`rankstream top --watch`: the board's table, redrawn in the terminal each time the board
changes, from the API's event stream (GET /v1/boards/{board}/events). It reconnects by itself
with Last-Event-ID, as a browser does, until Ctrl-C."""

from __future__ import annotations

import http.client
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from rankstream.show import ApiAnswerError, api_url, error_line, fetch, top_table

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen
RECONNECT_S = 2.0  # the stream's own `retry:` replaces it


@dataclass
class StreamEvent:
    event: str = "message"
    data: list[str] = field(default_factory=list)
    id: str | None = None


def parse_events(lines: Iterator[bytes]) -> Iterator[tuple[str, StreamEvent | int]]:
    """("event", an event) for each event, ("retry", ms) for each retry field; comments skipped."""
    current = StreamEvent()
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if current.data:
                yield "event", current
            current = StreamEvent()
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            current.event = value
        elif name == "data":
            current.data.append(value)
        elif name == "id":
            current.id = value
        elif name == "retry" and value.isdigit():
            yield "retry", int(value)


def _open(url: str, last_id: str | None) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "text/event-stream"})  # noqa: S310 - checked
    if last_id is not None:
        request.add_header("Last-Event-ID", last_id)
    # longer than the longest keep-alive interval a node may be set to (300 s): a silent stream
    # is a dead one only past it
    return urllib.request.urlopen(request, timeout=330)  # noqa: S310 - the scheme is checked by the caller


def watch_top(
    api: str,
    board: str,
    out: TextIO = sys.stdout,
    *,
    pages: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    **params: Any,
) -> int:
    """Draw each page the stream pushes until interrupted (or `pages` of them, for tests)."""
    # a first read: a bad board, window or API address is one line now, not a retry loop
    fetch(api, f"/v1/boards/{board}/top", {**params, "limit": params.get("limit") or 10})
    url = api_url(api, f"/v1/boards/{board}/events", params)
    clear = CLEAR if out.isatty() else ""
    last_id: str | None = None
    wait = RECONNECT_S
    drawn = 0
    while pages is None or drawn < pages:
        try:
            with _open(url, last_id) as stream:
                for kind, item in parse_events(iter(stream.readline, b"")):
                    if isinstance(item, int):
                        wait = item / 1000
                        continue
                    assert kind == "event"
                    body = orjson.loads("\n".join(item.data))
                    if item.event == "top":
                        last_id = item.id
                        out.write(f"{clear}{top_table(body)}\n\n")
                        out.flush()
                        drawn += 1
                        if pages is not None and drawn >= pages:
                            return 0
                    elif item.event == "unavailable":
                        error = body.get("error", {})
                        out.write(f"unavailable: {error.get('code')}: {error.get('message')}\n")
                        out.flush()
        except urllib.error.HTTPError as exc:
            said = error_line(exc, url)
            if exc.code < 500 and exc.code != 429:  # a bad request or token: no retry mends it
                raise ApiAnswerError(said) from None
            out.write(f"{said}\n")
            retry_after = exc.headers.get("Retry-After", "")
            wait = max(wait, float(retry_after)) if retry_after.isdigit() else wait
        except (OSError, http.client.HTTPException):
            pass  # the node went away, or cut a page short: reconnect, as a browser would
        out.write("reconnecting…\n")
        out.flush()
        sleep(wait)
    return 0
