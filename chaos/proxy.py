"""A TCP proxy the harness puts between the service and Redis: it passes bytes through, adds
latency (Redis slowed down), or cuts every connection and refuses new ones (Redis unreachable)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from rankstream.stack import free_port

CHUNK = 65_536


class Proxy:
    """127.0.0.1:`port` -> 127.0.0.1:`target`, served by an event loop in a thread."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.delay_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)
        self._thread.start()
        self._call(self._listen())

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}
        await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))
        self._writers -= {client_w, server_w}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def cut(self) -> None:
        """Every connection reset, new ones refused: Redis is unreachable."""
        self._call(self._cut())

    def restore(self) -> None:
        """Connections accepted again."""
        self._call(self._listen())

    def slow(self, delay_s: float) -> None:
        """Each chunk of bytes, either way, `delay_s` late (0: full speed)."""
        self.delay_s = delay_s

    def close(self) -> None:
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
