"""A private PgBouncer in transaction pooling mode, in front of the test PostgreSQL server.

``PgBouncer.start()`` writes its own configuration into a temporary folder, listens on a free
port of 127.0.0.1 (no Unix socket), and forwards every database name to the server at
``$PGHOST:$PGPORT`` as ``$PGUSER`` (trust, as the test server is set up); the shared server
is never reconfigured. Debian's ``pgbouncer`` refuses to run as root: as root it is started
with ``-u postgres`` (or ``nobody``). ``scripts/test`` installs the package when it is
missing; without it the tests that need it are skipped with a banner, and fail under
CI=true (``require``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

#: Where Debian installs it (``/usr/sbin`` is not on every user's PATH).
CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
#: Server connections per (database, user): small, so that transactions of different
#: client connections share server connections, as they do in production.
POOL_SIZE = 8


def binary() -> str | None:
    found = shutil.which("pgbouncer")
    return found or next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)


def require() -> str:
    """The pgbouncer executable; else skip loudly (fail under CI=true)."""
    found = binary()
    if found:
        return found
    banner = (f"\n{'!' * 78}\nPGBOUNCER TESTS NOT RUN: pgbouncer is not installed; install "
              "Debian's pgbouncer (apt-get install pgbouncer) or run scripts/test, which "
              f"installs it when run as root\n{'!' * 78}")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(banner + "\nUnder CI=true this is a failure.", pytrace=False)
    pytest.skip(banner)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One pgbouncer process with a configuration of its own (``start``/``stop``)."""

    host = "127.0.0.1"

    def __init__(self, executable: str, *, pool_mode: str = "transaction") -> None:
        self.executable = executable
        self.pool_mode = pool_mode
        self.folder = Path(tempfile.mkdtemp(prefix="dbworker-pgbouncer-"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.server = (os.environ.get("PGHOST", "127.0.0.1"), os.environ.get("PGPORT", "5432"),
                       os.environ.get("PGUSER", "postgres"))

    @property
    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _configure(self) -> Path:
        host, port, user = self.server
        (self.folder / "users.txt").write_text(f'"{user}" ""\n')
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port} user={user}\n"
            "[pgbouncer]\n"
            f"listen_addr = {self.host}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.folder / 'users.txt'}\n"
            f"admin_users = {user}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {POOL_SIZE}\n"
            "max_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        return ini

    def start(self, timeout: float = 10) -> PgBouncer:
        command = [self.executable]
        if os.geteuid() == 0:  # "PgBouncer should not run as root"
            command += ["-u", _unprivileged_user()]
        for _ in range(5):  # another process may take the free port before we bind it
            self.port = free_port()
            ini = self._configure()
            log = (self.folder / "pgbouncer.log").open("wb")
            self.process = subprocess.Popen([*command, str(ini)], stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            if self._wait_listening(timeout):
                return self
            self.stop()
        raise AssertionError(f"pgbouncer did not start; its log:\n{self.log}")

    def _wait_listening(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            with socket.socket() as s:
                if s.connect_ex((self.host, self.port)) == 0:
                    return True
            time.sleep(0.02)
        return False

    def admin(self, command: str) -> list[dict[str, object]]:
        """The answer of PgBouncer's admin console (``SHOW POOLS``, ``SHOW SERVERS``...)."""
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=self.server[2],
                             dbname="pgbouncer", autocommit=True) as conn:
            cursor = conn.execute(command)
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise AssertionError("pgbouncer refuses to run as root, and there is no postgres or "
                         "nobody user to run it as")
