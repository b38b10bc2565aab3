"""A real PostgreSQL server for the tests: started once per session from the Debian packages
the set-up installs, its data in a private temporary folder, listening on loopback only. As
root (CI) the server runs as the `postgres` user; anyone else runs it as themselves. With
QJSFLOW_TEST_POSTGRES_URL set (an administrator's URL), that server is used instead.

Nothing is skipped when it is missing: the fixture fails, naming what to install.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from tests.net import free_port


@dataclass
class PostgresServer:
    folder: str
    port: int
    bin_dir: str
    url: str | None = None  # a server of the developer's own (QJSFLOW_TEST_POSTGRES_URL)
    listen: str = "127.0.0.1"  # its addresses, comma-separated

    @property
    def admin_url(self) -> str:
        return self.url or f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def restart(self) -> None:
        """Restart the server (every connection is dropped), as a failover or upgrade would."""
        data = os.path.join(self.folder, "data")
        options = _server_options(self.folder, self.port, self.listen)
        _as_postgres(f"{self.bin_dir}/pg_ctl", "-D", data, "-o", options, "-l",
                     f"{self.folder}/log", "-m", "fast", "-w", "restart")  # fmt: skip

    def new_database(self) -> str:
        name = f"qjsflow_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.admin_url.rsplit("/", 1)[0] + f"/{name}"


def _as_postgres(*command: str) -> subprocess.CompletedProcess[str]:
    """PostgreSQL refuses to run as root: as root, run it as `postgres`; else as oneself."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, *command], capture_output=True, text=True, timeout=120, check=True
    )


def _server_options(
    folder: str, port: int, listen: str = "127.0.0.1", *, durable: bool = False
) -> str:
    """Loopback only. No fsync (unless `durable`, for the benchmarks): the tests restart and
    kill servers but never lose power, and a synced CREATE DATABASE per test was a third of
    the fast tier's PostgreSQL time."""
    durability = "" if durable else "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    return f"-h {listen} -p {port} -k {folder} -c max_connections=200 {durability}"


@contextlib.contextmanager
def postgres_server(
    *, own: bool = False, also_on: str | None = None, durable: bool = False
) -> Iterator[PostgresServer]:
    """A server for the session (`own`: a fresh one, never the developer's, for tests that
    restart it; `also_on`: an address of a test host of the test's own, e.g. a network
    namespace's peer, where it listens too and trusts that /24)."""
    url = os.environ.get("QJSFLOW_TEST_POSTGRES_URL")
    if url and not own:
        yield PostgresServer("", 0, "", url)
        return
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run `make setup` (Debian's postgresql)")
    bin_dir = os.path.dirname(found[-1])
    folder = tempfile.mkdtemp(prefix="qjsflow-pg-")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    listen = "127.0.0.1" if also_on is None else f"127.0.0.1,{also_on}"
    server = PostgresServer(folder, free_port(), bin_dir, listen=listen)
    data = os.path.join(folder, "data")
    _as_postgres(f"{bin_dir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8")
    if also_on is not None:
        network = also_on.rsplit(".", 1)[0] + ".0/24"
        with open(os.path.join(data, "pg_hba.conf"), "a", encoding="utf-8") as hba:
            hba.write(f"host all all {network} trust\n")
    options = _server_options(folder, server.port, listen, durable=durable)
    _as_postgres(
        f"{bin_dir}/pg_ctl", "-D", data, "-o", options, "-l", f"{folder}/log", "-w", "start"
    )
    try:
        yield server
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            _as_postgres(f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def pgbouncer(server: PostgresServer, *, pool_size: int = 40) -> Iterator[str]:
    """PgBouncer (Debian's) in front of `server`, pooling by transaction, as a platform would
    run it; yields a function's worth of URL: the bouncer's base, `postgresql://…:PORT`. Its
    databases are the server's; a journal's URL through it carries
    `?qjsflow_pooling=transaction`. The bouncer ignores the startup `options` qjsflow sends (a
    session's bounds: set them on the server's role when a bouncer is in front)."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        raise RuntimeError("PgBouncer is not installed: run `make setup` (Debian's pgbouncer)")
    folder = tempfile.mkdtemp(prefix="qjsflow-pgbouncer-")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    port = free_port()
    users = os.path.join(folder, "users.txt")
    with open(users, "w", encoding="utf-8") as handle:
        handle.write('"postgres" ""\n')
    config = os.path.join(folder, "pgbouncer.ini")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(
            f"[databases]\n* = host=127.0.0.1 port={server.port}\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
            f"unix_socket_dir = {folder}\nauth_type = trust\nauth_file = {users}\n"
            "pool_mode = transaction\nignore_startup_parameters = extra_float_digits,options\n"
            f"max_client_conn = 500\ndefault_pool_size = {pool_size}\n"
            f"logfile = {folder}/log\n"
        )
    for path in (users, config):
        if os.geteuid() == 0:
            shutil.chown(path, "postgres")
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    process = subprocess.Popen([*prefix, binary, config], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stderr is not None
        for line in process.stderr:  # its log as it comes: ready once it listens
            if "listening on 127.0.0.1" in line:
                break
        else:
            raise RuntimeError(f"PgBouncer did not start (see {folder}/log)")
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(folder, ignore_errors=True)
