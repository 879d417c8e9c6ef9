"""The uncached reads bench/api measures, spread over the board: the wrk script's arguments, the
constant-rate client's request files, and the checks that each answers 200 with the shape of
its route (a broken route fails the bench rather than measuring its errors)."""

from __future__ import annotations

import random
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.common import REPO, BenchError, Result, say
from bench.harness.http1 import Request, write_requests
from bench.harness.probes import get_json
from bench.harness.rate import constant_rate
from bench.harness.wrk import Script

BOARD = "gift:big"
BOARD_PATH = f"/v1/boards/{BOARD}"
MEMBERS = 100_000  # named u0000000 .. u0099999
DISTINCT_MIN = 10_000  # members (offsets) each read spreads over, at least
RATE_REQUESTS = 10_000  # distinct requests of each read in the rate client's file
WRK_POOL = 32_768  # requests wrk_reads.lua formats at init (~28,000 distinct members)
LOOKUP_POOL = 64  # lookup bodies it builds (500 distinct members each)
LOOKUP_SIZE = 500
AROUND_N = 5
WRK_SCRIPT = REPO / "bench" / "lua" / "wrk_reads.lua"
CHECKED = 3  # requests of each read checked before measuring


def member_id(i: int) -> str:
    return f"u{i:07d}"


@dataclass(frozen=True)
class Read:
    name: str  # its keys' prefix: <name>_rps, <name>_p99_ms_at_half, ...
    kind: str  # wrk_reads.lua's kind
    line: str  # what its request line looks like (a regex)


READS = (
    Read("redis_top10", "top", rf"GET {BOARD_PATH}/top\?limit=10&offset=\d+&nocache=1"),
    Read("member", "member", rf"GET {BOARD_PATH}/members/u\d{{7}}\?nocache=1"),
    Read("around", "around", rf"GET {BOARD_PATH}/members/u\d{{7}}/around\?n={AROUND_N}&nocache=1"),
    Read("lookup500", "lookup", rf"POST {BOARD_PATH}/members/lookup\?nocache=1"),
)


def make_requests(kind: str, rng: random.Random, n: int = RATE_REQUESTS) -> list[Request]:
    """`n` distinct requests of a read (distinct members, offsets, or member sets)."""
    if kind == "top":
        offsets = rng.sample(range(MEMBERS - 9), n)
        return [Request("GET", f"{BOARD_PATH}/top?limit=10&offset={o}&nocache=1") for o in offsets]
    if kind == "lookup":
        path = f"{BOARD_PATH}/members/lookup?nocache=1"
        return [
            Request(
                "POST", path, {"members": [member_id(i) for i in rng.sample(range(MEMBERS), LOOKUP_SIZE)]}
            )
            for _ in range(n)
        ]
    suffix = {"member": "?nocache=1", "around": f"/around?n={AROUND_N}&nocache=1"}[kind]
    return [
        Request("GET", f"{BOARD_PATH}/members/{member_id(i)}{suffix}") for i in rng.sample(range(MEMBERS), n)
    ]


def write_request_files(folder: Path, rng: random.Random) -> dict[str, Path]:
    """The rate client's request file of each read: RATE_REQUESTS distinct requests."""
    files: dict[str, Path] = {}
    for read in READS:
        files[read.name] = folder / f"requests-{read.name}.jsonl"
        write_requests(files[read.name], make_requests(read.kind, rng))
    return files


def wrk_script(read: Read, seed: int) -> Script:
    pool = LOOKUP_POOL if read.kind == "lookup" else WRK_POOL
    return Script(WRK_SCRIPT, (read.kind, BOARD, str(MEMBERS), str(seed), str(pool), str(LOOKUP_SIZE)))


def _fail(read: Read, request: Request, why: str, answer: Any) -> BenchError:
    shown = orjson.dumps(answer)[:300]
    return BenchError(f"{read.name}: {request.method} {request.path}: {why}: {shown!r}")


def check_answer(read: Read, request: Request, answer: Any) -> None:
    """The answer of a request of `read` is its route's, from Redis (uncached)."""
    if answer.get("source") != "redis":
        raise _fail(read, request, "not answered from Redis", answer)
    if read.kind == "top":
        offset = int(urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)["offset"][0])
        items = answer.get("items", ())
        if answer.get("total") != MEMBERS or len(items) != 10 or items[0].get("rank") != offset + 1:
            raise _fail(read, request, f"not the 10 from rank {offset + 1} of {MEMBERS}", answer)
    elif read.kind == "member":
        wanted = request.path.split("/")[-1].split("?")[0]
        rank = answer.get("rank")
        if answer.get("member") != wanted or not isinstance(rank, int) or not 1 <= rank <= MEMBERS:
            raise _fail(read, request, f"not {wanted}'s rank", answer)
    elif read.kind == "around":
        wanted = request.path.split("/")[-2]
        names = [i.get("member") for i in answer.get("items", ())]
        if answer.get("total") != MEMBERS or wanted not in names or not 1 <= len(names) <= 2 * AROUND_N + 1:
            raise _fail(read, request, f"not the members around {wanted}", answer)
    else:
        wanted_all = request.body["members"]
        items = answer.get("items", ())
        if [i.get("member") for i in items] != wanted_all or any(i.get("rank") is None for i in items):
            raise _fail(read, request, f"not the ranks of the {len(wanted_all)} members asked", answer)


def check_reads(base: str, files: Mapping[str, Path]) -> dict[str, Any]:
    """The first CHECKED requests of each read's file answer 200 with their route's shape; a
    sample answer of each (a lookup's cut to its first items)."""
    samples: dict[str, Any] = {}
    for read in READS:
        with files[read.name].open("rb") as lines:
            requests = [Request(**orjson.loads(next(lines))) for _ in range(CHECKED)]
        for request in requests:
            answer = get_json(base + request.path, request.method, request.body)
            check_answer(read, request, answer)
        if "items" in answer and len(answer["items"]) > 3:
            answer = {**answer, "items": [*answer["items"][:3], f"... {len(answer['items'])} items"]}
        samples[read.name] = answer
    return samples


def check_warm(answer: Any) -> None:
    """A warm (cacheable) top-10 answer: the board's first 10."""
    items = answer.get("items", ())
    if answer.get("total") != MEMBERS or len(items) != 10 or items[0].get("rank") != 1:
        raise BenchError(f"unexpected warm top-10 answer: {orjson.dumps(answer)[:300]!r}")


def check_wrk_info(read: Read, info: Mapping[str, Any]) -> None:
    """What wrk_reads.lua reported of its pool: spread enough, the request line of `read`."""
    if int(info.get("distinct_keys", 0)) < DISTINCT_MIN:
        raise BenchError(f"{read.name}: wrk's pool spans {info.get('distinct_keys')} keys, < {DISTINCT_MIN}")
    if not re.fullmatch(rf"{read.line} HTTP/1\.1", str(info.get("first", ""))):
        raise BenchError(f"{read.name}: wrk sends {info.get('first')!r}, not /{read.line}/")


def at_half(  # noqa: PLR0917 - one each
    base: str,
    maxima: Mapping[str, float],
    files: Mapping[str, Path],
    pids: dict[str, int],
    rounds: int,
    floor: tuple[str, dict[str, int]],
) -> dict[str, Result]:
    """Each read at half its measured maximum, at a constant rate (the rate client, its request
    file), `rounds` interleaved rounds; the best (lowest p99) of each, every round's p99 kept.
    Under "bare": `floor` (the bare app's URL and pids) at the top-10's rate in each round."""
    runs: dict[str, list[Result]] = {"bare": [], **{read.name: [] for read in READS}}
    for round_no in range(rounds):
        rate = maxima["redis_top10"] / 2
        one = constant_rate(floor[0], rate, floor[1])
        say(
            f"round {round_no + 1}: bare at {rate:,.0f} req/s: p50 {one['p50_ms']} ms, p99 {one['p99_ms']} ms"
        )
        runs["bare"].append({**one, "target_rps": round(rate, 1)})
        for read in READS:
            rate = maxima[read.name] / 2
            say(f"round {round_no + 1}: {read.name} at a constant {rate:,.0f} req/s (half its max)")
            one = constant_rate(f"{base}/", rate, pids, requests_file=files[read.name])
            say(f"round {round_no + 1}: {read.name}: p50 {one['p50_ms']} ms, p99 {one['p99_ms']} ms")
            runs[read.name].append({**one, "target_rps": round(rate, 1)})
    return {
        name: {
            **min(results, key=lambda r: float(r["p99_ms"])),
            "runs_p99_ms": [r["p99_ms"] for r in results],
        }
        for name, results in runs.items()
    }
