"""Lua scripts as files under common/store/lua/, called by SHA with a fallback for NOSCRIPT
(a Redis restart or failover forgets loaded scripts). Only the wrappers of this package see EVAL.

Each script starts with a generated prelude: `C`, the constants it shares with Python (the
exact score bound, the tie prefix, apply.lua's statuses: common/store/encoding.py), and `H`, the
positions of the KEYS and ARGV fields as its wrapper sends them, so no number is written twice."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from common.store.encoding import EXACT_MAX, TIE_MAX, TIE_WIDTH, Status
from common.store.keys import INDEX_EXPIRY_SPREAD_MS
from common.store.pipe import Pipe
from common.store.topology import Store

KeyT = str | bytes
ArgT = str | bytes | int | float


@dataclass(frozen=True)
class Call:
    """One script invocation, ready to go into a pipeline."""

    keys: Sequence[KeyT]
    args: Sequence[ArgT]
    ids: Sequence[str] = ()  # the event ids it carries, for logs and tests; not sent


@dataclass
class LuaScript:
    """A script, run by SHA: EVALSHA, or EVALSHA_RO for a script whose file says `--! read-only`
    (Redis refuses it any write, and runs it for a user whose keys are read-only: the API's)."""

    name: str
    source: str
    sha: str = field(init=False)
    command: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA1
        read_only = any(line.startswith(READ_ONLY) for line in self.source.splitlines())
        self.command = "EVALSHA_RO" if read_only else "EVALSHA"

    def run(self, client: Store, keys: Sequence[KeyT], args: Sequence[ArgT]) -> Any:
        return self.run_many(client, [Call(keys, args)])[0]

    def run_many(self, client: Store, calls: Sequence[Call], raise_on_error: bool = True) -> list[Any]:
        """All calls in one round trip. Calls refused with NOSCRIPT did not run, so they are
        re-sent after SCRIPT LOAD; any other error is raised, or with `raise_on_error=False`
        returned in its call's place (a connection failure raises on one server; a cluster
        pipeline returns it in the place of each call it failed)."""
        results = self._pipeline(client, calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            client.script_load(self.source)
            retried = self._pipeline(client, [calls[i] for i in missing])
            for i, result in zip(missing, retried, strict=True):
                results[i] = result
        for result in results:
            if raise_on_error and isinstance(result, Exception):
                raise result
        return results

    async def run_pipe(self, pipe: Pipe, keys: Sequence[KeyT], args: Sequence[ArgT]) -> Any:
        """One call from asyncio code, on the API's pipelined connection (common/store/pipe.py);
        NOSCRIPT means it did not run, so load and send again."""
        try:
            return await pipe.send(self.command, self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await pipe.send("SCRIPT", "LOAD", self.source)
            return await pipe.send(self.command, self.sha, len(keys), *keys, *args)

    async def run_pipe_many(
        self, pipe: Pipe, calls: Sequence[tuple[Sequence[KeyT], Sequence[ArgT]]]
    ) -> list[Any]:
        """Several calls at once (one write; no task per call), their replies in order; a call
        met with NOSCRIPT is loaded and sent again alone."""
        sent = [pipe.send(self.command, self.sha, len(keys), *keys, *args) for keys, args in calls]
        replies = await asyncio.gather(*sent, return_exceptions=True)
        out = []
        for (keys, args), reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError):
                reply = await self.run_pipe(pipe, keys, args)  # noqa: PLW2901 - the retried call's
            elif isinstance(reply, BaseException):
                raise reply
            out.append(reply)
        return out

    def _pipeline(self, client: Store, calls: Sequence[Call]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for call in calls:  # not pipe.evalsha: a cluster pipeline refuses it
            args = (self.command, self.sha, len(call.keys), *call.keys, *call.args)
            if isinstance(client, RedisCluster) and call.keys:
                # named, else redis-py asks Redis which are the keys (COMMAND GETKEYS, a round
                # trip per call: 40 us of worker CPU a call); a redirect is routed by the key
                node = client.get_node_from_key(call.keys[0])  # type: ignore[no-untyped-call]
                pipe.execute_command(*args, target_nodes=node)
            else:
                pipe.execute_command(*args)
        return pipe.execute(raise_on_error=False)


INCLUDE = "--! include "
READ_ONLY = "--! read-only"  # run with EVALSHA_RO: a user whose keys are read-only may run it
Layouts = tuple[tuple[str, tuple[str, ...]], ...]


def _prelude(layouts: Layouts) -> str:
    statuses = ", ".join(f"{s.name} = {s.value}" for s in Status)
    shared = f"EXACT = {EXACT_MAX}, TIE_MAX = {TIE_MAX}, TIE_WIDTH = {TIE_WIDTH}"
    shared += f", INDEX_SPREAD = {INDEX_EXPIRY_SPREAD_MS}"
    lines = [f"local C = {{{shared}, ST = {{{statuses}}}}}"]
    for table, names in layouts:
        fields = ", ".join(f"{n} = {i}" for i, n in enumerate(names, 1))
        lines.append(f"local {table} = {{{fields}, _N = {len(names)}}}")
    return "\n".join(lines) + "\n"


def _read(name: str) -> str:
    return resources.files("common.store").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


@cache
def load_script(name: str, layouts: Layouts = ()) -> LuaScript:
    """common/store/lua/<name>.lua after the prelude, with the files its `--! include <lib>`
    lines name in between (Redis runs one source per script: the libraries are concatenated
    ahead of it). `layouts`: (Lua table, field names) pairs, e.g. ("H", ("W", "E")) becomes
    `local H = {W = 1, E = 2, _N = 2}`: where the wrapper puts each field, and how many."""
    source = _read(name)
    libs = [line[len(INCLUDE) :].strip() for line in source.splitlines() if line.startswith(INCLUDE)]
    return LuaScript(name, _prelude(layouts) + "".join(_read(lib) + "\n" for lib in libs) + source)
