"""A TCP forwarder that adds a round-trip time: distance between a client and a server.

This machine's kernel has no ``netem`` (``tc qdisc ... netem`` fails: unknown qdisc), so the
delay is put in user space. Each chunk read from one side is held RTT/2 and then written to
the other side, in each direction, in order (a delay, not a rate limit: chunks in flight
overlap, as on a long wire). Opening a connection costs one RTT too (the TCP handshake a
real network would have): the upstream connection is opened RTT after the client's.

It counts, per connection and in total, the bytes and chunks each way, and the **turns**: the
client->server bursts that follow server->client data already delivered to the client (and
the first burst of each connection), that is the round trips the client waited for. A
client that sends again before the server's data reached it (pipelining) opens no new turn.

Standalone (stdlib only)::

    python bench/netdelay.py --listen 127.0.0.1:6001 --connect 127.0.0.1:5432 --rtt-ms 1 \\
        --stats /tmp/stats.json

prints ``ready`` on stdout once listening; writes the counts as JSON to ``--stats`` on
SIGUSR1 (and keeps running: a benchmark reads counts between phases) and on SIGTERM/SIGINT
(then exits); ``snapshot(pid, path)`` does that from another process and returns the
counts. Importable: ``Forwarder(...).start()`` runs it in a thread of its own, ``.stats()``
returns the counts, ``.stop()`` ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import selectors
import signal
import sys
import threading
import time
from typing import Any

#: Closed connections kept one by one in the stats (the totals keep counting all of them).
KEEP_CLOSED = 1000


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), with a message naming the value on bad input."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:6001)")
    return host, int(port)


class Counts:
    """Bytes, chunks and turns of one connection (or of all of them)."""

    FIELDS = ("bytes_up", "bytes_down", "chunks_up", "chunks_down", "turns")

    def __init__(self) -> None:
        for name in self.FIELDS:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.FIELDS}


class Link:
    """One client connection and its upstream: two delayed one-way pipes and their counts."""

    def __init__(self, forwarder: Forwarder, number: int, peer: Any) -> None:
        self.forwarder = forwarder
        self.number = number
        self.peer = peer
        self.opened = time.time()
        self.closed: float | None = None
        self.counts = Counts()
        self.heard_server = True  # the first burst counts as a turn
        self.client: asyncio.Transport | None = None
        self.server: asyncio.Transport | None = None
        self.up: collections.deque[bytes] = collections.deque()  # client -> server, in order
        self.down: collections.deque[bytes] = collections.deque()  # server -> client
        self.pending_up: list[bytes] = []  # read before the upstream connection exists

    # Each chunk gets one timer; the timer writes the OLDEST chunk of its direction, so the
    # order holds whatever order timers of equal time fire in.
    def from_client(self, data: bytes) -> None:
        counts, total = self.counts, self.forwarder.total
        if self.heard_server:
            self.heard_server = False
            counts.turns += 1
            total.turns += 1
        counts.bytes_up += len(data)
        counts.chunks_up += 1
        total.bytes_up += len(data)
        total.chunks_up += 1
        if self.server is None:
            self.pending_up.append(data)
            return
        self._send(self.up, data, self._write_up)

    def from_server(self, data: bytes) -> None:
        counts, total = self.counts, self.forwarder.total
        counts.bytes_down += len(data)
        counts.chunks_down += 1
        total.bytes_down += len(data)
        total.chunks_down += 1
        self._send(self.down, data, self._write_down)

    def _send(self, queue: collections.deque[bytes], data: bytes, write: Any) -> None:
        half = self.forwarder.half
        if half <= 0 and not queue:
            queue.append(data)
            write()
            return
        queue.append(data)
        loop = self.forwarder.loop
        assert loop is not None
        loop.call_at(loop.time() + half, write)

    def _write_up(self) -> None:
        data = self.up.popleft()
        if self.server is not None and not self.server.is_closing():
            self.server.write(data)

    def _write_down(self) -> None:
        data = self.down.popleft()
        if self.client is not None and not self.client.is_closing():
            self.client.write(data)
            self.heard_server = True

    def connected_upstream(self, transport: asyncio.Transport) -> None:
        self.server = transport
        for data in self.pending_up:
            self._send(self.up, data, self._write_up)
        self.pending_up.clear()

    def close_later(self, transport: asyncio.Transport | None, queue: collections.deque) -> None:
        """Close ``transport`` once the chunks already on their way to it are written."""
        if transport is None:
            return
        loop = self.forwarder.loop
        assert loop is not None

        def close() -> None:
            if queue:
                loop.call_later(max(self.forwarder.half, 0.001), close)
            else:
                transport.close()

        loop.call_later(self.forwarder.half, close)

    def finished(self) -> None:
        if self.closed is None:
            self.closed = time.time()
            self.forwarder.retire(self)

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "peer": str(self.peer),
            "opened": self.opened,
            "closed": self.closed,
            **self.counts.as_dict(),
        }


class _ClientSide(asyncio.Protocol):
    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.link: Link | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.link = self.forwarder.open_link(transport)

    def data_received(self, data: bytes) -> None:
        assert self.link is not None
        self.link.from_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        assert self.link is not None
        self.link.close_later(self.link.server, self.link.up)
        self.link.finished()


class _ServerSide(asyncio.Protocol):
    def __init__(self, link: Link) -> None:
        self.link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.link.connected_upstream(transport)

    def data_received(self, data: bytes) -> None:
        self.link.from_server(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.close_later(self.link.client, self.link.down)
        self.link.finished()


class Forwarder:
    """Forward ``listen`` to ``connect`` with ``rtt_ms`` of round-trip time, counting turns.

    ``start()`` runs it in a daemon thread and returns the port it listens on (give port 0
    to pick a free one); ``stats()`` returns the counts; ``stop()`` ends it.
    """

    def __init__(
        self,
        listen: tuple[str, int],
        connect: tuple[str, int],
        rtt_ms: float,
    ) -> None:
        if rtt_ms < 0:
            raise ValueError(f"rtt_ms={rtt_ms!r}: a round-trip time is 0 or more milliseconds")
        self.listen = listen
        self.connect = connect
        self.rtt_ms = rtt_ms
        self.half = rtt_ms / 2000.0
        self.total = Counts()
        self.connections = 0
        self.open: dict[int, Link] = {}
        self.closed: collections.deque[Link] = collections.deque(maxlen=KEEP_CLOSED)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.Server | None = None
        self.port: int | None = None
        self.started = time.time()
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    # -- the link bookkeeping --------------------------------------------------------------
    def open_link(self, client: asyncio.Transport) -> Link:
        self.connections += 1
        link = Link(self, self.connections, client.get_extra_info("peername"))
        link.client = client
        self.open[link.number] = link
        assert self.loop is not None
        self.loop.create_task(self._connect_upstream(link))
        return link

    async def _connect_upstream(self, link: Link) -> None:
        if self.half > 0:
            await asyncio.sleep(2 * self.half)  # the handshake's round trip
        assert self.loop is not None
        try:
            await self.loop.create_connection(lambda: _ServerSide(link), *self.connect)
        except OSError:
            if link.client is not None:
                link.client.close()

    def retire(self, link: Link) -> None:
        if self.open.pop(link.number, None) is not None:
            self.closed.append(link)

    def stats(self) -> dict[str, Any]:
        """The counts so far: totals, and every open (and the last closed) connection."""
        links = [*self.closed, *self.open.values()]
        return {
            "listen": f"{self.listen[0]}:{self.port}",
            "connect": f"{self.connect[0]}:{self.connect[1]}",
            "rtt_ms": self.rtt_ms,
            "started": self.started,
            "at": time.time(),
            "connections": self.connections,
            "open_connections": len(self.open),
            "total": self.total.as_dict(),
            "per_connection": [link.as_dict() for link in links],
        }

    def write_stats(self, path: str) -> None:
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as out:
            json.dump(self.stats(), out)
        os.replace(temporary, path)  # a reader never sees half a file

    # -- running ---------------------------------------------------------------------------
    async def serve(self) -> None:
        """Listen until ``stop()``; sets ``self.port``."""
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self.server = await self.loop.create_server(
            lambda: _ClientSide(self), self.listen[0], self.listen[1], reuse_address=True
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def wait_closed(self) -> None:
        assert self._stopped is not None
        await self._stopped.wait()
        assert self.server is not None
        self.server.close()
        for link in list(self.open.values()):
            for transport in (link.client, link.server):
                if transport is not None:
                    transport.close()

    def start(self) -> int:
        """Run in a daemon thread; returns the port it listens on."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            async def main() -> None:
                try:
                    await self.serve()
                except BaseException as exc:
                    failure.append(exc)
                    ready.set()
                    return
                ready.set()
                await self.wait_closed()

            run_precisely(main())

        self._thread = threading.Thread(target=run, name="netdelay", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        assert self.port is not None
        return self.port

    def stop(self) -> None:
        """End the thread ``start()`` began (closing every connection)."""
        if self.loop is not None and self._stopped is not None:
            self.loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=5)


def snapshot(pid: int, path: str, timeout: float = 10.0) -> dict[str, Any]:
    """Ask the forwarder process ``pid`` (started with ``--stats path``) for its counts now:
    SIGUSR1, then wait for a file written after the signal, and return what it holds."""
    asked = time.time()
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as found:
                stats = json.load(found)
        except (OSError, ValueError):
            stats = None
        if stats is not None and stats["at"] >= asked:
            return stats
        time.sleep(0.002)
    raise TimeoutError(f"the forwarder {pid} wrote no stats to {path} within {timeout:g}s")


def run_precisely(main: Any) -> None:
    """``asyncio.run(main)`` on a loop whose timers wake within tens of microseconds.

    The default selector (epoll) waits whole milliseconds (asyncio rounds its timeout up):
    a hold of 0.5 ms would last 1 ms, and a 1 ms RTT come out as 2 ms. ``select()`` takes
    microseconds (and this process watches a few sockets only).
    """
    with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(
            selectors.SelectSelector())) as runner:
        runner.run(main)


async def _main(args: argparse.Namespace) -> None:
    forwarder = Forwarder(args.listen, args.connect, args.rtt_ms)
    await forwarder.serve()
    loop = asyncio.get_running_loop()

    def dump() -> None:
        if args.stats:
            forwarder.write_stats(args.stats)

    def finish() -> None:
        dump()
        assert forwarder._stopped is not None
        forwarder._stopped.set()

    loop.add_signal_handler(signal.SIGUSR1, dump)
    loop.add_signal_handler(signal.SIGTERM, finish)
    loop.add_signal_handler(signal.SIGINT, finish)
    print("ready", flush=True)
    await forwarder.wait_closed()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--connect", required=True, metavar="HOST:PORT")
    parser.add_argument("--rtt-ms", type=float, required=True, metavar="X")
    parser.add_argument("--stats", metavar="FILE", help="JSON counts on SIGUSR1/SIGTERM/SIGINT")
    args = parser.parse_args(argv)
    try:
        args.listen = parse_address(args.listen)
        args.connect = parse_address(args.connect)
    except ValueError as exc:
        parser.error(str(exc))
    if args.rtt_ms < 0:
        parser.error(f"--rtt-ms {args.rtt_ms}: a round-trip time is 0 or more milliseconds")
    try:
        run_precisely(_main(args))
    except OSError as exc:
        sys.exit(f"netdelay: {exc}")


if __name__ == "__main__":
    main()
