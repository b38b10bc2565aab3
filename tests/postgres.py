"""A real PostgreSQL server for the tests: started once per session from the Debian packages
the set-up installs, its data in a private temporary folder, listening on loopback only.

Nothing is skipped when it is missing: the fixture fails, naming what to install.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg


@dataclass
class PostgresServer:
    folder: str
    port: int
    bin_dir: str

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def restart(self) -> None:
        """Restart the server (every connection is dropped), as a failover or upgrade would."""
        data = os.path.join(self.folder, "data")
        options = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -c max_connections=200"
        _as_postgres(f"{self.bin_dir}/pg_ctl", "-D", data, "-o", options, "-l",
                     f"{self.folder}/log", "-m", "fast", "-w", "restart")  # fmt: skip

    def new_database(self) -> str:
        name = f"qjsflow_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


def _as_postgres(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", *command],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run `make setup` (Debian's postgresql)")
    bin_dir = os.path.dirname(found[-1])
    folder = tempfile.mkdtemp(prefix="qjsflow-pg-")
    shutil.chown(folder, "postgres")
    server = PostgresServer(folder, _free_port(), bin_dir)
    data = os.path.join(folder, "data")
    _as_postgres(f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8")
    options = f"-h 127.0.0.1 -p {server.port} -k {folder} -c max_connections=200"
    _as_postgres(
        f"{bin_dir}/pg_ctl", "-D", data, "-o", options, "-l", f"{folder}/log", "-w", "start"
    )
    try:
        yield server
    finally:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
