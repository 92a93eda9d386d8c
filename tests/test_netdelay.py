"""bench/netdelay.py, the forwarder that adds a round-trip time: delay, order and counts."""

import importlib.util
import json
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "netdelay.py"
_spec = importlib.util.spec_from_file_location("netdelay", SCRIPT)
assert _spec is not None and _spec.loader is not None
netdelay = importlib.util.module_from_spec(_spec)
sys.modules["netdelay"] = netdelay
_spec.loader.exec_module(netdelay)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


@pytest.fixture
def forward(echo):
    started = []

    def start(rtt_ms):
        forwarder = netdelay.Forwarder(("127.0.0.1", 0), echo, rtt_ms)
        port = forwarder.start()
        started.append(forwarder)
        return forwarder, port

    yield start
    for forwarder in started:
        forwarder.stop()


def _recv_exactly(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed early"
        data += chunk
    return data


def _round_trip(sock, message=b"ping"):
    begin = time.perf_counter()
    sock.sendall(message)
    assert _recv_exactly(sock, len(message)) == message
    return time.perf_counter() - begin


def test_a_round_trip_takes_the_rtt_and_is_counted_as_a_turn(forward):
    forwarder, port = forward(40)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = sorted(_round_trip(sock) for _ in range(5))
    assert times[0] >= 0.040, times  # never sooner than the delay (later under load)
    total = forwarder.stats()["total"]
    assert total["turns"] == 5
    assert total["bytes_up"] == total["bytes_down"] == 20


def test_opening_a_connection_costs_a_round_trip(forward):
    _forwarder, port = forward(40)
    begin = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        _round_trip(sock)
    # The handshake's RTT, then the data's: 80 ms, never less.
    assert time.perf_counter() - begin >= 0.080


def test_chunks_in_flight_overlap_a_delay_not_a_rate_limit(forward):
    forwarder, port = forward(40)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _round_trip(sock)
        for n in range(10):
            sock.sendall(b"%03d" % n)
            time.sleep(0.002)
        data = _recv_exactly(sock, 30)
    assert data == b"".join(b"%03d" % n for n in range(10))
    # Ten chunks 2 ms apart travel together, one delay for all, not one each: sent without
    # waiting for the replies on their way, they make one turn (plus the first round trip).
    # (No bound on the time they took: a loaded machine makes any bound a coin toss.)
    assert forwarder.stats()["total"]["turns"] == 2


def test_order_holds_in_each_direction_under_many_small_chunks(forward):
    forwarder, port = forward(2)
    payload = b"".join(b"%06d," % n for n in range(20000))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sender = threading.Thread(
            target=lambda: [sock.sendall(payload[i : i + 70]) for i in range(0, len(payload), 70)]
        )
        sender.start()
        received = _recv_exactly(sock, len(payload))
        sender.join()
    assert received == payload
    stats = forwarder.stats()
    assert stats["total"]["bytes_up"] == stats["total"]["bytes_down"] == len(payload)


def test_counts_per_connection_and_in_total(forward):
    forwarder, port = forward(0)
    for turns in (3, 7):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for _ in range(turns):
                _round_trip(sock, b"abc")
    deadline = time.monotonic() + 5
    while forwarder.stats()["open_connections"] and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = forwarder.stats()
    assert stats["connections"] == 2
    assert [c["turns"] for c in stats["per_connection"]] == [3, 7]
    assert [c["bytes_up"] for c in stats["per_connection"]] == [9, 21]
    assert stats["total"]["turns"] == 10


def test_the_command_prints_ready_and_writes_stats_on_usr1_and_term(echo, tmp_path):
    stats = tmp_path / "stats.json"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        str(SCRIPT),
        "--listen",
        f"127.0.0.1:{port}",
        "--connect",
        f"{echo[0]}:{echo[1]}",
        "--rtt-ms",
        "1",
        "--stats",
        str(stats),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        with socket.create_connection(("127.0.0.1", port)) as sock:
            _round_trip(sock)
            _round_trip(sock)
            process.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5
            while not stats.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert json.loads(stats.read_text())["total"]["turns"] == 2
            _round_trip(sock)
            # snapshot(): the signal, then a file written after it (not the last one).
            now = netdelay.snapshot(process.pid, str(stats))
            assert now["total"]["turns"] == 3
            assert now["open_connections"] == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.wait()
    final = json.loads(stats.read_text())
    assert final["total"]["turns"] == 3
    assert final["rtt_ms"] == 1.0


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--listen", "nowhere", "'nowhere' is not HOST:PORT"),
        ("--connect", "127.0.0.1:99999", "'127.0.0.1:99999' is not HOST:PORT"),
        ("--rtt-ms", "-1", "--rtt-ms -1.0: a round-trip time is 0 or more"),
    ],
)
def test_bad_options_name_the_value(option, value, message):
    arguments = {"--listen": "127.0.0.1:0", "--connect": "127.0.0.1:1", "--rtt-ms": "1"}
    arguments[option] = value
    command = [sys.executable, str(SCRIPT), *[x for pair in arguments.items() for x in pair]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr
