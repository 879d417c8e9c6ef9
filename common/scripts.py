"""Lua scripts as files under common/lua/, called by SHA with a fallback for NOSCRIPT
(a Redis restart or failover forgets loaded scripts). Nothing else in the code sees EVAL."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

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
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA1

    def run(self, client: redis.Redis, keys: Sequence[KeyT], args: Sequence[ArgT]) -> Any:
        return self.run_many(client, [Call(keys, args)])[0]

    def run_many(self, client: redis.Redis, calls: Sequence[Call], raise_on_error: bool = True) -> list[Any]:
        """All calls in one round trip. Calls refused with NOSCRIPT did not run, so they are
        re-sent after SCRIPT LOAD; any other error is raised, or with `raise_on_error=False`
        returned in its call's place (a connection failure always raises)."""
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

    async def run_async(self, client: aioredis.Redis, keys: Sequence[KeyT], args: Sequence[ArgT]) -> Any:
        """One call from asyncio code; NOSCRIPT means it did not run, so load and send again."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await client.script_load(self.source)
            return await client.evalsha(self.sha, len(keys), *keys, *args)

    def _pipeline(self, client: redis.Redis, calls: Sequence[Call]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for call in calls:
            pipe.evalsha(self.sha, len(call.keys), *call.keys, *call.args)
        return pipe.execute(raise_on_error=False)


INCLUDE = "--! include "


def _read(name: str) -> str:
    return resources.files("common").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


@cache
def load_script(name: str) -> LuaScript:
    """common/lua/<name>.lua, with the files its `--! include <lib>` lines name prepended (Redis
    runs one source per script: the libraries are concatenated ahead of it)."""
    source = _read(name)
    libs = [line[len(INCLUDE) :].strip() for line in source.splitlines() if line.startswith(INCLUDE)]
    return LuaScript(name, "".join(_read(lib) + "\n" for lib in libs) + source)
