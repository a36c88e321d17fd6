"""Real PostgreSQL and MariaDB servers (auth_db's tests and bench.auth_db), on 127.0.0.1.

Each server keeps its data directory (`data/`) and its log in the directory it is given;
the unix socket, through which `sql()` runs statements as the superuser, lies inside the
data directory. The first start creates VerneMQ's database `vernemq_db`, its table
`vmq_auth_acl` and the user `root` with password `password` (VerneMQ's defaults), which
must give that password over TCP. stop() and start() again keep the port and the data;
kill() SIGKILLs every process of the server (testing/lifecycle.py).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Self

from testing.lifecycle import HOST, Missing, ServerError, ServerProcess

USER = "root"
PASSWORD = "password"
DATABASE = "vernemq_db"
INIT_TIMEOUT = 60.0  # initdb / mariadb-install-db
CLIENT_TIMEOUT = 30.0  # one sql() call
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes, the last one a NUL

PG_ROOT = Path("/usr/lib/postgresql")  # Debian: /usr/lib/postgresql/NN/bin, not on PATH


class SqlError(Exception):
    """A statement given to sql() failed; the message is the client's stderr."""


def client_env() -> dict[str, str]:
    """The environment without the variables that would redirect a client or a server
    (PGHOST, PGPASSWORD, PGDATA, MYSQL_PWD, MYSQL_HOST...)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PG", "MYSQL", "MARIADB"))
    }


def processes_in(directory: Path) -> set[int]:
    """The live processes whose working directory is `directory`: a server chdirs to its
    data directory and its children inherit it, even those that leave its process group
    (postgres's call setsid) or outlive it (reparented when the postmaster dies)."""
    target = os.path.realpath(directory)
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone, or a zombie (no cwd)
                if os.readlink(entry / "cwd") == target:
                    found.add(int(entry.name))
    return found


def run_client(args: list[str], text: str) -> str:
    """Runs a command-line client with `text` on its stdin; its stdout, or SqlError."""
    done = subprocess.run(
        args,
        input=text,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
        env=client_env(),
        check=False,
    )
    if done.returncode != 0:
        raise SqlError(f"{Path(args[0]).name} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class DatabaseServer(ServerProcess):
    """What both servers add to the shared life cycle: a data directory, prepared once
    (`_initialise`), in which the server runs with all its processes, and the schema,
    created after the first start (`_create_schema`)."""

    START_TIMEOUT = 20.0  # until the server accepts connections
    NEW_SESSION = True  # not in the caller's group: no Ctrl-C of theirs

    def __init__(self, directory: Path, port: int | None = None) -> None:
        super().__init__(directory, port)
        self.data_dir = self.directory / "data"
        self._schema_made = self.directory / "schema-made"  # the data directory has it

    # ------------------------------------------------------------------ to override

    def _initialised(self) -> bool:
        raise NotImplementedError

    def _initialise(self) -> None:
        raise NotImplementedError

    def _create_schema(self) -> None:
        raise NotImplementedError

    def _socket_path(self, port: int) -> Path:
        raise NotImplementedError

    # ------------------------------------------------------------------ life cycle

    def start(self) -> Self:
        """Starts the server (see ServerProcess.start); the first start creates the
        schema."""
        super().start()
        if not self._schema_made.exists():
            try:
                self._create_schema()
            except BaseException:
                self.close()
                raise
            self._schema_made.touch()
        return self

    def _prepare(self) -> None:
        if not self._initialised():
            self._initialise()

    def _launch(self, port: int) -> bool:
        socket_path = self._socket_path(port)
        assert len(bytes(socket_path)) <= SOCKET_PATH_MAX, f"path too long: {socket_path}"
        return super()._launch(port)

    def _workdir(self) -> Path:
        return self.data_dir

    def _environment(self) -> dict[str, str]:
        return client_env()

    def _processes(self) -> set[int]:
        return super()._processes() | processes_in(self.data_dir)

    def _run_init(self, args: list[str]) -> None:
        """Runs initdb / mariadb-install-db into the log; on failure the half-made data
        directory goes, so that another start() begins afresh."""
        with self.log_path.open("ab") as log:
            log.write(f"--- {Path(args[0]).name}\n".encode())
            log.flush()
            done = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                env=client_env(),
                timeout=INIT_TIMEOUT,
                check=False,
            )
        if done.returncode != 0:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise ServerError(
                f"{Path(args[0]).name} exited {done.returncode}; "
                f"{self.log_path}:\n{self.log_tail()}"
            )


# ---------------------------------------------------------------------- PostgreSQL


def postgres_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/NN/bin with a server in it, else the directory of
    `postgres` on PATH."""

    def version(bin_dir: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in bin_dir.parent.name.split(".") if part.isdigit())

    found = [path for path in PG_ROOT.glob("*/bin") if (path / "postgres").is_file()]
    if found:
        return max(found, key=version)
    on_path = shutil.which("postgres")
    return Path(on_path).resolve().parent if on_path else None


def unprivileged_prefix() -> list[str]:
    """postgres and initdb refuse to run as root: as root, run them as `nobody`. They keep
    one capability, to search directories, so as to reach their data directory under
    the caller's temporary directory (pytest's are mode 0700, root's); they can write no
    more than `nobody` can."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise Missing("setpriv is not installed (apt-get install util-linux)")
    nobody = pwd.getpwnam("nobody")
    return [
        *(setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"),
        *("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"),
    ]


class PostgresServer(DatabaseServer):
    """One PostgreSQL cluster: superuser `postgres` (trusted on the unix socket only),
    user `root`/`password` over TCP (scram-sha-256), database `vernemq_db` with pgcrypto
    and VerneMQ's table `vmq_auth_acl`."""

    NAME = "postgres"
    STOP_SIGNAL = signal.SIGINT  # "fast" shutdown: SIGTERM would wait for the clients to leave

    SCHEMA = """
        CREATE EXTENSION pgcrypto;
        CREATE TABLE vmq_auth_acl (
          mountpoint character varying(10) NOT NULL,
          client_id character varying(128) NOT NULL,
          username character varying(128) NOT NULL,
          password character varying(128),
          publish_acl json,
          subscribe_acl json,
          CONSTRAINT vmq_auth_acl_primary_key PRIMARY KEY (mountpoint, client_id, username));
        GRANT ALL PRIVILEGES ON TABLE vmq_auth_acl TO root;
    """

    def _find_binaries(self) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None or not (bin_dir / "initdb").is_file():
            raise Missing("postgresql is not installed (apt-get install postgresql)")
        self.bin_dir = bin_dir
        # The client of the same version; else Debian's wrapper on PATH.
        psql = bin_dir / "psql"
        self.psql = str(psql) if psql.is_file() else shutil.which("psql") or "psql"
        self.prefix = unprivileged_prefix()

    def _initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def _initialise(self) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.data_dir, nobody.pw_uid, nobody.pw_gid)
        self._run_init(
            [
                *(*self.prefix, str(self.bin_dir / "initdb"), "-D", str(self.data_dir)),
                *("-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256"),
                *("--no-locale", "-E", "UTF8", "--no-sync"),
            ]
        )

    def _socket_path(self, port: int) -> Path:
        return self.data_dir / f".s.PGSQL.{port}"

    def _command(self, port: int) -> list[str]:
        settings = {
            "listen_addresses": HOST,
            "unix_socket_directories": str(self.data_dir),  # never /var/run/postgresql
            # No waiting for the disk, but each commit is written (synchronous_commit on):
            # it survives kill(), not a crash of the machine.
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "16MB",
            "autovacuum": "off",
        }
        options = [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        postgres = str(self.bin_dir / "postgres")
        return [*self.prefix, postgres, "-D", str(self.data_dir), "-p", str(port), *options]

    def _answers(self, port: int) -> bool:
        """postmaster.pid names our process and says "ready" (as pg_ctl -w checks)."""
        assert self.proc is not None
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0] == str(self.proc.pid) and lines[7].strip() == "ready"

    def _create_schema(self) -> None:
        self.sql(
            f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'; CREATE DATABASE {DATABASE};",
            database="postgres",
        )
        self.sql(self.SCHEMA)

    def _after_kill(self) -> None:
        """A SIGKILLed postmaster leaves its System V shared memory segment; a restart
        would reuse it, but a server never restarted would leak it."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            shmid = lines[6].split()[1]
        except (OSError, IndexError):
            return
        if shmid.isdigit() and (ipcrm := shutil.which("ipcrm")):
            subprocess.run([ipcrm, "-m", shmid], capture_output=True, check=False)

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{PASSWORD}@{HOST}:{self.port}/{DATABASE}"

    def sql(self, text: str, database: str = DATABASE) -> str:
        """Runs `text` (statements separated by ;) as the superuser over the unix socket;
        returns the rows, one a line, columns separated by |. SqlError if one fails."""
        return run_client(
            [
                *(self.psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"),
                *("-h", str(self.data_dir), "-p", str(self.port), "-U", "postgres"),
                *("-d", database, "-f", "-"),
            ],
            text,
        )


# ---------------------------------------------------------------------- MariaDB


class MariaDbServer(DatabaseServer):
    """One MariaDB server: `root`@`localhost` without a password on the unix socket (for
    sql()), `root`@`127.0.0.1` and `root`@`%` with `password` over TCP, database
    `vernemq_db` with VerneMQ's table `vmq_auth_acl`."""

    NAME = "mariadb"
    STOP_SIGNAL = signal.SIGTERM  # a normal shutdown, which ends the connections

    # Small, for a quick start (at install too: the redo log's size is fixed there). Each
    # commit is written, not flushed (=2): it survives kill(), not a crash of the machine.
    FAST = (
        "--skip-log-bin",
        "--skip-performance-schema",
        "--innodb-buffer-pool-size=16M",
        "--innodb-log-file-size=4M",
        "--innodb-flush-log-at-trx-commit=2",
        "--innodb-doublewrite=0",
        "--innodb-buffer-pool-load-at-startup=0",
        "--innodb-buffer-pool-dump-at-shutdown=0",
    )

    # mariadb-install-db makes root accounts without a password for TCP too (127.0.0.1,
    # ::1, the host's name): only those with the password remain.
    SCHEMA = f"""
        CREATE DATABASE {DATABASE};
        DROP USER IF EXISTS '{USER}'@'127.0.0.1', '{USER}'@'::1',
                            '{USER}'@'{socket.gethostname()}';
        CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}',
                    '{USER}'@'%' IDENTIFIED BY '{PASSWORD}';
        GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'127.0.0.1', '{USER}'@'%';
        CREATE TABLE {DATABASE}.vmq_auth_acl (
          mountpoint VARCHAR(10) NOT NULL, client_id VARCHAR(128) NOT NULL,
          username VARCHAR(128) NOT NULL, password VARCHAR(128),
          publish_acl TEXT, subscribe_acl TEXT,
          CONSTRAINT vmq_auth_acl_primary_key PRIMARY KEY (mountpoint, client_id, username));
    """

    def _find_binaries(self) -> None:
        server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin")
        install_db = shutil.which("mariadb-install-db")
        client = shutil.which("mariadb")
        if server is None or install_db is None or client is None:
            raise Missing("mariadb-server is not installed (apt-get install mariadb-server)")
        self.server, self.install_db, self.client = server, install_db, client
        # mariadbd runs as root only when told so; files stay root's, as pytest's are.
        self.user_args = ["--user=root"] if os.geteuid() == 0 else []

    @property
    def socket_path(self) -> Path:
        return self.data_dir / "mariadb.sock"

    def _socket_path(self, port: int) -> Path:
        return self.socket_path

    def _initialised(self) -> bool:
        return (self.data_dir / "mysql").is_dir()

    def _initialise(self) -> None:
        self._run_init(
            [
                *(self.install_db, "--no-defaults", f"--datadir={self.data_dir}"),
                *(*self.user_args, "--auth-root-authentication-method=normal", "--skip-test-db"),
                *self.FAST,
            ]
        )

    def _command(self, port: int) -> list[str]:
        return [
            *(self.server, "--no-defaults", f"--datadir={self.data_dir}", *self.user_args),
            *(f"--port={port}", f"--bind-address={HOST}", "--skip-name-resolve"),
            *(f"--socket={self.socket_path}", f"--pid-file={self.data_dir / 'mariadbd.pid'}"),
            *self.FAST,
        ]

    def _answers(self, port: int) -> bool:
        """The server greets on its socket (ours: it lies in our data directory) only
        once it accepts connections."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(1.0)
            try:
                sock.connect(str(self.socket_path))
                return bool(sock.recv(1))
            except OSError:
                return False

    def _create_schema(self) -> None:
        self.sql(self.SCHEMA, database="mysql")

    @property
    def url(self) -> str:
        return f"mysql://{USER}:{PASSWORD}@{HOST}:{self.port}/{DATABASE}"

    def sql(self, text: str, database: str = DATABASE) -> str:
        """Runs `text` (statements separated by ;) as root over the unix socket; returns
        the rows, one a line, columns separated by tabs. SqlError if one fails."""
        return run_client(
            [
                *(self.client, "--no-defaults", f"--socket={self.socket_path}", "--user=root"),
                *("--batch", "--skip-column-names", f"--database={database}"),
            ],
            text,
        )
