"""The API's Redis connection against a Redis Cluster: one auto-pipelined connection per master
(common/store/pipe.py), each command sent to the master serving its key's slot.

The slot map comes from CLUSTER SLOTS of any node known (the URL's first). A reply that says the
map is wrong is followed, never shown to the caller: MOVED (the slot has a new owner: that slot
is pointed there at once and the whole map reloaded), ASK (the slot is moving and the key is
already there: ASKING then the command, written together on the target's connection), TRYAGAIN
(the slot is moving and the command's keys are split: sent again shortly). A connection that
fails (a master killed) reloads the map and sends again, until the replica promoted in its place
answers. Every command the API sends is a read, so sending one again is safe. A command is given
up after `MAX_TRIES` MOVED replies (a map that keeps being wrong) or `give_up_s`: ASK, TRYAGAIN,
failing connections and failed map reloads are waited out until then, with a pause between map
reloads (a moving slot, a failover; a cluster that stays down answers 503).

Keyless commands: PING and SCRIPT go to every master (a script is loaded where it runs; ready
means every master answers); the pub/sub feed subscribes to any node, since a PUBLISH reaches
every node of a cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

from common.store.pipe import Arg, Pipe, RedisPipe, connection_args
from common.store.tls import NO_TLS, RedisTls
from common.store.topology import SLOTS

MAX_TRIES = 8  # MOVED replies a call may meet (a map that keeps being wrong)
RELOAD_PAUSE_S = 0.1  # between slot map reloads while nodes fail or a slot is not served
TRYAGAIN_PAUSE_S = 0.05
_BROADCAST = frozenset({b"PING", b"SCRIPT"})
_KEY_AT = {b"EVALSHA": 3, b"EVALSHA_RO": 3, b"EVAL": 3}  # where the first key is; 1 for other keyed commands
_RELOAD = (redis.ConnectionError, redis.TimeoutError, ClusterDownError)
Node = tuple[str, int]


def _bytes(arg: Arg) -> bytes:
    return arg if isinstance(arg, bytes) else str(arg).encode()


def slot_of(args: tuple[Arg, ...]) -> int | None:
    """The slot of the command's first key; None for a keyless one."""
    at = _KEY_AT.get(_bytes(args[0]).upper(), 1)
    if at == 3 and int(args[2]) == 0:  # EVALSHA sha numkeys key...
        return None
    return key_slot(_bytes(args[at])) if len(args) > at else None


class ClusterPipe:
    """`send` and `call` as RedisPipe's, over every master of a cluster (see the module's doc)."""

    def __init__(
        self, url: str, connect_timeout: float = 1.0, reply_timeout: float = 2.0, name: str = "",
        tls: RedisTls = NO_TLS,
    ) -> None:  # fmt: skip
        parts = urlsplit(url)
        self._url, self._name, self.tls = parts, name, tls
        self._timeouts = (connect_timeout, reply_timeout)
        self._give_up_s = 2 * reply_timeout + 2 * connect_timeout
        self._seed: Node = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._slots: list[Node | None] = [None] * SLOTS
        self._nodes: list[Node] = [self._seed]  # every node the last map named, masters first
        self._pipes: dict[Node, RedisPipe] = {}
        self._reload: asyncio.Task[None] | None = None
        self._closed = False
        self.reloads = 0

    def url_of(self, node: Node) -> str:
        """The URL of one node, with the cluster URL's scheme and credentials."""
        auth = self._url.netloc.rpartition("@")[0]
        netloc = f"{auth}@{node[0]}:{node[1]}" if auth else f"{node[0]}:{node[1]}"
        return urlunsplit((self._url.scheme, netloc, "/0", "", ""))

    def feed_url(self, attempt: int) -> str:
        """Where the change feed subscribes on its `attempt`-th try: any node hears every PUBLISH."""
        return self.url_of(self._nodes[attempt % len(self._nodes)])

    def send(self, *args: Arg) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        outer: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            outer.set_exception(redis.ConnectionError("the Redis client is closed"))
        else:
            self._route(args, outer, 1, time.monotonic() + self._give_up_s)
        return outer

    async def call(self, *args: Arg) -> Any:
        return await self.send(*args)

    def _pipe(self, node: Node) -> RedisPipe:
        pipe = self._pipes.get(node)
        if pipe is None:
            connect, reply = self._timeouts
            pipe = self._pipes[node] = RedisPipe(self.url_of(node), connect, reply, self._name, self.tls)
        return pipe

    def _route(self, args: tuple[Arg, ...], outer: asyncio.Future[Any], tries: int, until: float) -> None:
        if outer.done():
            return  # its caller went away
        if self._closed:  # a retry timer or a reload that outlived aclose(): open nothing again
            outer.set_exception(redis.ConnectionError("the Redis client is closed"))
            return
        if _bytes(args[0]).upper() in _BROADCAST:
            self._broadcast(args, outer, tries, until)
            return
        slot = slot_of(args)
        node = self._nodes[0] if slot is None else self._slots[slot]
        if node is None:  # no map yet, or a slot nobody serves (a master lost, no replica yet)
            if time.monotonic() > until:
                outer.set_exception(ClusterDownError(f"slot {slot} is not served"))
                return
            self._start_reload(pause=RELOAD_PAUSE_S if self._reload is not None else 0.0)
            self._after_reload(lambda: self._route(args, outer, tries, until), outer)
            return
        self._watch(self._pipe(node).send(*args), args, outer, tries, until)

    def _watch(
        self, inner: asyncio.Future[Any], args: tuple[Arg, ...], outer: asyncio.Future[Any], tries: int,
        until: float,
    ) -> None:  # fmt: skip
        inner.add_done_callback(lambda done: self._done(done, args, outer, tries, until))

    def _done(
        self, inner: asyncio.Future[Any], args: tuple[Arg, ...], outer: asyncio.Future[Any], tries: int,
        until: float,
    ) -> None:  # fmt: skip
        if inner.cancelled():
            if not outer.done():
                outer.cancel()
            return
        exc = inner.exception()
        if outer.done():
            return
        if exc is None:
            outer.set_result(inner.result())
            return
        # ASK and TRYAGAIN last while a slot's keys are split between two masters (a migration in
        # progress, as long as its keys take to move; a command of keys on both sides goes
        # ASK, TRYAGAIN, ASK... until then), a failover until a replica is promoted: waited out
        # until give-up time. Only MOVED counts as a send (a map that keeps being wrong).
        counted = isinstance(exc, MovedError)
        if (
            (tries >= MAX_TRIES and counted)
            or time.monotonic() > until
            or not isinstance(exc, (AskError, TryAgainError, *_RELOAD))
        ):
            outer.set_exception(exc)
            return
        if self._closed:
            outer.set_exception(redis.ConnectionError("the Redis client is closed"))
        elif isinstance(exc, MovedError):  # the one redirect counted (`tries`)
            self._slots[exc.slot_id] = (exc.host, int(exc.port))
            self._start_reload()
            self._route(args, outer, tries + 1, until)
        elif isinstance(exc, AskError):  # written together: ASKING holds for the next command only
            pipe = self._pipe((exc.host, int(exc.port)))
            pipe.send("ASKING").add_done_callback(_retrieve)
            self._watch(pipe.send(*args), args, outer, tries, until)
        elif isinstance(exc, TryAgainError):
            asyncio.get_running_loop().call_later(TRYAGAIN_PAUSE_S, self._route, args, outer, tries, until)
        else:  # the node is away: perhaps failed over
            self._start_reload(pause=RELOAD_PAUSE_S)
            self._after_reload(lambda: self._route(args, outer, tries, until), outer)

    def _broadcast(self, args: tuple[Arg, ...], outer: asyncio.Future[Any], tries: int, until: float) -> None:
        if outer.done():
            return
        if self._closed:
            outer.set_exception(redis.ConnectionError("the Redis client is closed"))
            return
        masters = sorted({n for n in self._slots if n is not None})
        if not masters:  # no map yet, or a cluster that serves no slot (forming, reset)
            if time.monotonic() > until:
                outer.set_exception(ClusterDownError("no master of the Redis Cluster serves a slot"))
                return
            self._start_reload(pause=RELOAD_PAUSE_S if self._reload is not None else 0.0)
            self._after_reload(lambda: self._broadcast(args, outer, tries, until), outer)
            return
        replies = [self._pipe(node).send(*args) for node in masters]

        def gathered(done: asyncio.Future[list[Any]]) -> None:
            if outer.done():
                if not done.cancelled():
                    done.exception()
                return
            if done.cancelled():
                outer.cancel()
            elif (exc := done.exception()) is not None:
                if isinstance(exc, _RELOAD) and time.monotonic() < until:
                    self._start_reload(pause=RELOAD_PAUSE_S)
                    self._after_reload(lambda: self._broadcast(args, outer, tries, until), outer)
                else:
                    outer.set_exception(exc)
            else:
                outer.set_result(done.result()[0])

        asyncio.gather(*replies).add_done_callback(gathered)

    def _after_reload(self, then: Callable[[], None], outer: asyncio.Future[Any]) -> None:
        task = self._start_reload()

        def resume(done: asyncio.Task[None]) -> None:
            if outer.done():
                return
            if done.cancelled() or self._closed:
                outer.set_exception(redis.ConnectionError("the Redis client is closed"))
            else:  # loaded, or no node answered: `then` sends again or gives up at its give-up time
                then()

        task.add_done_callback(resume)

    def _start_reload(self, pause: float = 0.0) -> asyncio.Task[None]:
        if self._reload is None or self._reload.done():
            self._reload = asyncio.get_running_loop().create_task(self._load_map(pause))
            self._reload.add_done_callback(_retrieve)  # a failed reload nobody waits on logs nothing
        return self._reload

    async def _load_map(self, pause: float) -> None:
        """The slot map from the first known node that answers CLUSTER SLOTS."""
        if pause:
            await asyncio.sleep(pause)
        errors: list[str] = []
        for node in [*self._nodes, self._seed]:
            if self._closed:
                raise redis.ConnectionError("the Redis client is closed")
            try:
                ranges = await self._pipe(node).call("CLUSTER", "SLOTS")
            except redis.RedisError as exc:
                errors.append(f"{node[0]}:{node[1]}: {exc}")
                continue
            self._apply_map(ranges, node)
            return
        raise redis.ConnectionError(f"no node of the Redis Cluster answered: {'; '.join(errors)[:300]}")

    def _apply_map(self, ranges: list[list[Any]], asked: Node) -> None:
        slots: list[Node | None] = [None] * SLOTS
        masters: list[Node] = []
        replicas: list[Node] = []
        for first, last, master, *copies in ranges:
            owner = self._node(master, asked)
            slots[first : last + 1] = [owner] * (last + 1 - first)
            masters.append(owner)
            replicas += [self._node(c, asked) for c in copies]
        self._slots = slots
        self._nodes = list(dict.fromkeys([*masters, *replicas])) or [self._seed]
        self.reloads += 1
        # the connections of nodes the map no longer names stay (idle, closed with the client):
        # CLUSTER SLOTS can lag behind the MOVED or ASK a call in flight on one just followed

    @staticmethod
    def _node(entry: list[Any], asked: Node) -> Node:
        host = entry[0].decode() if isinstance(entry[0], bytes) else str(entry[0])
        return (host or asked[0], int(entry[1]))  # an empty host: the address we asked

    async def aclose(self) -> None:
        self._closed = True
        if self._reload is not None:
            self._reload.cancel()
        for pipe in list(self._pipes.values()):
            await pipe.aclose()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def open_pipe(
    url: str, cluster: bool, connect_timeout: float, reply_timeout: float, name: str, *,
    tls: RedisTls = NO_TLS,
) -> Pipe:  # fmt: skip
    """The API's Redis connection: one server's, or a cluster's (RANKSTREAM_REDIS_CLUSTER)."""
    if cluster:
        connection_args(url, tls=tls)  # the same URL check as one server's
        return ClusterPipe(url, connect_timeout, reply_timeout, name, tls)
    return RedisPipe(url, connect_timeout, reply_timeout, name, tls)
