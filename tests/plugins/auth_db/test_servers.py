"""The database fixtures themselves: each server starts, wants the password over TCP,
keeps its port and its data across stop/start, and kill() leaves no process behind.

TCP clients are the command-line ones (psql, mariadb), as no driver is in the venv.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from testing.databases import DATABASE, PASSWORD, USER, MariaDbServer, PostgresServer, client_env
from testing.lifecycle import HOST

ROW = "('', 'client-1', 'user-1', 'hash', '[{\"pattern\": \"a/#\"}]', NULL)"
TIMEOUT = 30.0


def psql_tcp(
    server: PostgresServer, query: str, *, user: str = USER, password: str = PASSWORD
) -> subprocess.CompletedProcess[str]:
    url = f"postgresql://{user}:{password}@{HOST}:{server.port}/{DATABASE}"
    return subprocess.run(
        [server.psql, "-X", "-w", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", query],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=client_env(),
        check=False,
    )


def mariadb_tcp_args(server: MariaDbServer, query: str, password: str = PASSWORD) -> list[str]:
    return [
        *(server.client, "--no-defaults", "--protocol=TCP", f"--host={HOST}"),
        *(f"--port={server.port}", f"--user={USER}", f"--password={password}"),
        *("--batch", "--skip-column-names", f"--database={DATABASE}", "--execute", query),
    ]


def mariadb_tcp(
    server: MariaDbServer, query: str, password: str = PASSWORD
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        mariadb_tcp_args(server, query, password),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=client_env(),
        check=False,
    )


def process_table() -> dict[int, tuple[str, int]]:
    """pid -> (state, parent pid), from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        table[int(stat.parent.name)] = (fields[0], int(fields[1]))
    return table


def family(pid: int) -> set[int]:
    """`pid` and its children."""
    return {pid} | {child for child, (_, parent) in process_table().items() if parent == pid}


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` that still run (zombies count as gone)."""
    return {pid for pid, (state, _) in process_table().items() if pid in pids and state != "Z"}


def listeners(port: int) -> list[str]:
    """The local addresses (hex, as the kernel shows them) listening on TCP `port`."""
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path("/proc/net", table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.append(address)
    return found


def test_postgres_wants_the_password_over_tcp(postgres: PostgresServer) -> None:
    assert postgres.url == f"postgresql://root:password@127.0.0.1:{postgres.port}/vernemq_db"
    postgres.sql(
        "INSERT INTO vmq_auth_acl VALUES "
        "('', 'client-1', 'user-1', crypt('secret', gen_salt('bf')), '[]', NULL)"
    )
    # VerneMQ's query shape: the hash is checked in the database (pgcrypto).
    good = psql_tcp(
        postgres,
        "SELECT client_id FROM vmq_auth_acl "
        "WHERE username = 'user-1' AND password = crypt('secret', password)",
    )
    assert (good.returncode, good.stdout.strip()) == (0, "client-1"), good.stderr

    wrong = psql_tcp(postgres, "SELECT 1", password="wrong")
    assert wrong.returncode != 0
    assert 'password authentication failed for user "root"' in wrong.stderr
    # The superuser is trusted on the unix socket only.
    superuser = psql_tcp(postgres, "SELECT 1", user="postgres", password="")
    assert superuser.returncode != 0


def test_postgres_table_starts_empty(postgres: PostgresServer) -> None:
    assert postgres.sql("SELECT count(*) FROM vmq_auth_acl").strip() == "0"


def test_postgres_stop_and_start_keep_port_and_data(own_postgres: PostgresServer) -> None:
    port = own_postgres.port
    own_postgres.sql(f"INSERT INTO vmq_auth_acl VALUES {ROW}")
    # A client in the middle of a query: stop() ends it and does not wait for it.
    busy = subprocess.Popen(
        [own_postgres.psql, "-X", "-w", "-d", own_postgres.url, "-c", "SELECT pg_sleep(60)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=client_env(),
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while "pg_sleep" not in own_postgres.sql("SELECT query FROM pg_stat_activity"):
            assert time.monotonic() < deadline and busy.poll() is None, busy.communicate()
            time.sleep(0.02)
        own_postgres.stop()
        assert busy.wait(TIMEOUT) != 0
    finally:
        busy.kill()
        busy.communicate()
    assert psql_tcp(own_postgres, "SELECT 1").returncode != 0  # down

    own_postgres.start()
    assert own_postgres.port == port
    done = psql_tcp(own_postgres, "SELECT client_id, publish_acl FROM vmq_auth_acl")
    assert (done.returncode, done.stdout.strip()) == (0, 'client-1|[{"pattern": "a/#"}]')


def test_postgres_kill_leaves_nothing(own_postgres: PostgresServer) -> None:
    assert own_postgres.proc is not None
    processes = family(own_postgres.proc.pid)
    assert len(processes) > 1  # the postmaster and its workers (each in a group of its own)
    pid_file = (own_postgres.data_dir / "postmaster.pid").read_text().splitlines()
    shmid = pid_file[6].split()[1]
    own_postgres.sql(f"INSERT INTO vmq_auth_acl VALUES {ROW}")

    own_postgres.kill()
    assert alive(processes) == set()
    segments = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    assert shmid not in [line.split()[1] for line in segments]
    own_postgres.start()  # crash recovery: what was committed stays
    done = psql_tcp(own_postgres, "SELECT client_id FROM vmq_auth_acl")
    assert (done.returncode, done.stdout.strip()) == (0, "client-1"), done.stderr


def test_mariadb_wants_the_password_over_tcp(mariadb: MariaDbServer) -> None:
    assert mariadb.url == f"mysql://root:password@127.0.0.1:{mariadb.port}/vernemq_db"
    mariadb.sql(f"INSERT INTO vmq_auth_acl VALUES {ROW}")
    good = mariadb_tcp(mariadb, "SELECT client_id, publish_acl FROM vmq_auth_acl")
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == 'client-1\t[{"pattern": "a/#"}]'

    wrong = mariadb_tcp(mariadb, "SELECT 1", password="wrong")
    assert wrong.returncode != 0
    assert "Access denied for user 'root'@'127.0.0.1'" in wrong.stderr
    empty = mariadb_tcp(mariadb, "SELECT 1", password="")
    assert empty.returncode != 0


def test_mariadb_table_starts_empty(mariadb: MariaDbServer) -> None:
    assert mariadb.sql("SELECT count(*) FROM vmq_auth_acl").strip() == "0"


def test_mariadb_stop_and_start_keep_port_and_data(own_mariadb: MariaDbServer) -> None:
    port = own_mariadb.port
    own_mariadb.sql(f"INSERT INTO vmq_auth_acl VALUES {ROW}")
    busy = subprocess.Popen(
        mariadb_tcp_args(own_mariadb, "SELECT SLEEP(60)"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=client_env(),
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while "SLEEP(60)" not in own_mariadb.sql("SHOW PROCESSLIST"):
            assert time.monotonic() < deadline and busy.poll() is None, busy.communicate()
            time.sleep(0.02)
        started = time.monotonic()
        own_mariadb.stop()
        assert time.monotonic() - started < 10  # the sleeping client does not hold it up
        busy.wait(TIMEOUT)
    finally:
        busy.kill()
        busy.communicate()
    assert mariadb_tcp(own_mariadb, "SELECT 1").returncode != 0  # down

    own_mariadb.start()
    assert own_mariadb.port == port
    done = mariadb_tcp(own_mariadb, "SELECT client_id FROM vmq_auth_acl")
    assert (done.returncode, done.stdout.strip()) == (0, "client-1")


def test_mariadb_kill_leaves_nothing(own_mariadb: MariaDbServer) -> None:
    assert own_mariadb.proc is not None
    processes = family(own_mariadb.proc.pid)
    own_mariadb.sql(f"INSERT INTO vmq_auth_acl VALUES {ROW}")
    own_mariadb.kill()
    assert alive(processes) == set()
    own_mariadb.start()  # crash recovery: what was committed stays
    done = mariadb_tcp(own_mariadb, "SELECT client_id FROM vmq_auth_acl")
    assert (done.returncode, done.stdout.strip()) == (0, "client-1"), done.stderr


def test_both_listen_on_loopback_only(postgres: PostgresServer, mariadb: MariaDbServer) -> None:
    for server in (postgres, mariadb):
        assert listeners(server.port) == ["0100007F"]  # 127.0.0.1: no 0.0.0.0, no ::
