"""Real Kafka and real Redis on a machine without Docker.

Kafka is the Apache broker itself, its classpath resolved from Maven Central by
Maven into a user cache folder and run with the machine's Java (single-node KRaft).
Redis is the `redis-server` binary. Both run as child processes whose logs and data
live in one folder; `stop()` leaves no stray process.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import redis
from confluent_kafka.admin import AdminClient

from common.errors import StackError

KAFKA_VERSION = "4.1.1"
REDIS_INSTALL_HINT = "install it: apt-get install redis-server (Debian/Ubuntu) or brew install redis (macOS)"
CHROMIUM_INSTALL_HINT = "install them: apt-get install chromium chromium-driver (Debian/Ubuntu)"
NGINX_INSTALL_HINT = "install it: apt-get install nginx-light (Debian/Ubuntu) or brew install nginx (macOS)"
_log = logging.getLogger(__name__)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rankstream"


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
# where free_port looks first: above the well-known and registered services' ports, below both
# the kernel's usual ephemeral range and the Redis Cluster nodes' ports (rankstream/cluster.py:
# from 20000, their buses 10000 higher, both below the ephemeral range)
_PORTS_FROM, _PORTS_UNTIL = 10_000, 20_000


def ephemeral_low() -> int | None:
    """The first port the kernel hands out to outgoing connections (Linux); None: unknown."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(span: int = 1) -> int:
    """A port for a server to listen on (and the `span - 1` after it): free now, and below the
    kernel's ephemeral range where it has one, so no client connection takes it while the server
    starts (two CI runs met Kafka failing to bind a port a connection had taken meanwhile).
    Elsewhere, one the kernel picks."""
    low = ephemeral_low()
    until = min(low, _PORTS_UNTIL) if low is not None else 0
    if until - span > _PORTS_FROM:
        for _ in range(200):
            port = random.randrange(_PORTS_FROM, until - span + 1)  # noqa: S311 - a port, not a secret
            if all(port_bindable(port + k) for k in range(span)):
                return port
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            picked: int = sock.getsockname()[1]
        if picked + span <= 65536 and all(port_bindable(picked + k) for k in range(1, span)):
            return picked


def port_bindable(port: int) -> bool:
    """Whether a server could listen on the port now: bound the way Kafka and Redis bind (SO_REUSEADDR).

    A connect probe misses a port held as the local end of some client's connection; a bind sees it.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_pair() -> int:
    """A free port whose next port is free too (the local Kafka's controller listens on port + 1)."""
    return free_port(span=2)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _local_file(name: str) -> str:
    return resources.files("rankstream").joinpath("local", name).read_text(encoding="utf-8")


def _run_quiet(argv: list[str], what: str, timeout: float) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"{what} failed: {exc}") from None
    if proc.returncode != 0:  # the lines that say what went wrong, not a JVM's stack frames
        said = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if not _frame(line)]
        raise StackError(f"{what} failed (exit {proc.returncode}): {' | '.join(said[-3:])}")


def _frame(line: str) -> bool:
    """A line of a Java stack trace's frames ("at ...", "... 12 more")."""
    text = line.strip()
    return text.startswith("at ") or (text.startswith("...") and text.endswith("more"))


def ensure_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise StackError("java not found: Kafka needs Java >= 17 (apt-get install openjdk-17-jre-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    try:
        major = int(out.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        major = 0
    if major < 17:
        raise StackError(f"Kafka {KAFKA_VERSION} needs Java >= 17, found: {out.splitlines()[:1]}")
    return java


def ensure_kafka_jars(version: str = KAFKA_VERSION) -> Path:
    """The broker classpath folder, resolved once per machine and cached."""
    libs = cache_dir() / f"kafka-{version}" / "libs"
    done = libs / ".complete"
    if done.exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("mvn not found: it fetches the Kafka broker jars (apt-get install maven)")
    libs.mkdir(parents=True, exist_ok=True)
    pom = libs.parent / "pom.xml"
    pom.write_text(_local_file("kafka-pom.xml").replace("4.1.1", version), encoding="utf-8")
    _log.info("resolving the Kafka %s broker classpath into %s (once per machine)", version, libs)
    argv = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies"]
    argv += [f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
    _run_quiet(argv, "resolving Kafka jars with Maven", timeout=900)
    done.touch()
    return libs


def ensure_redis_server() -> str:
    """Path of redis-server; installs Debian's package when missing and we are root."""
    return _debian_binary("redis-server", "redis-server", REDIS_INSTALL_HINT)


def ensure_nginx() -> str:
    """Path of nginx, the HTTP cache the tests put in front of an API node (as a CDN would be);
    installs Debian's nginx-light when missing and we are root."""
    return _debian_binary("nginx", "nginx-light", NGINX_INSTALL_HINT)


def ensure_chromium() -> tuple[str, str]:
    """Paths of Chromium and its chromedriver, for the board page's browser test; installs
    Debian's chromium and chromium-driver when missing and we are root."""
    return (
        _debian_binary("chromium", "chromium", CHROMIUM_INSTALL_HINT),
        _debian_binary("chromedriver", "chromium-driver", CHROMIUM_INSTALL_HINT),
    )


def _debian_binary(name: str, package: str, hint: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        _log.info("%s missing: installing Debian's package %s", name, package)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
            if proc.returncode != 0:
                raise StackError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-200:]}")
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if not found:
        raise StackError(f"{name} not found: {hint}")
    return found


def docker_engine_available() -> bool:
    """True when a Docker engine answers (not merely a docker client on PATH)."""
    if shutil.which("docker") is None:
        return False
    try:
        proc = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@dataclass
class _Server:
    """A server child process with its folder, pid file and log."""

    name: str
    folder: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def pid_file(self) -> Path:
        return self.folder / f"{self.name}.pid"

    @property
    def out_file(self) -> Path:
        return self.folder / f"{self.name}.out"

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.out_file.open("ab") as out:
            # own session: a Ctrl-C meant for the supervisor must not kill servers mid-write
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )  # fmt: skip
        self.pid_file.write_text(str(self.proc.pid), encoding="utf-8")

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.out_file.read_text(errors="replace").strip().splitlines()[-5:]
            raise StackError(f"{self.name} exited with {self.proc.returncode}: {' | '.join(tail)}")

    def stop(self, timeout: float = 20.0) -> None:
        pid = self.proc.pid if self.proc else read_pid(self.pid_file)
        if pid is not None:
            terminate(pid, timeout)
        if self.proc is not None:
            # after SIGKILL: a JVM starved of CPU (a loaded box) has taken over 5 s to be gone
            self.proc.wait(timeout=30)
        self.pid_file.unlink(missing_ok=True)


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `timeout`."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: poll for its end instead
            done = 0 if pid_alive(pid) else pid
        if done == pid:
            return
        time.sleep(0.1)
    _log.warning("pid %d ignored SIGTERM for %.0fs: killing it", pid, timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class SaslListener:
    """More listeners, with Kafka's own authorizer on: SASL/SCRAM-SHA-512 over plain TCP, whose
    `users` (name -> password, made when the storage is formatted) may do only what ACLs allow;
    with `tls`, also a TLS listener on `tls_port` that wants a client certificate and takes its
    CN as the user's name (the same ACLs apply), and a SASL/SCRAM listener over TLS on
    `sasl_tls_port` (no client certificate). The PLAINTEXT listener's clients (and the
    controller's) are the super user ANONYMOUS, for setting those ACLs up."""

    port: int
    users: dict[str, str]
    tls: TlsFiles | None = None
    tls_port: int = 0
    sasl_tls_port: int = 0

    def ports(self) -> list[int]:
        return [self.port] if self.tls is None else [self.port, self.tls_port, self.sasl_tls_port]

    def properties(self) -> dict[str, str]:
        listeners, protocols = f"SASL_PLAINTEXT://127.0.0.1:{self.port},", "SASL_PLAINTEXT:SASL_PLAINTEXT,"
        more = [
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users=User:ANONYMOUS",
            "allow.everyone.if.no.acl.found=false",
        ]
        if self.tls is not None:
            listeners += f"SSL://127.0.0.1:{self.tls_port},SASL_SSL://127.0.0.1:{self.sasl_tls_port},"
            protocols += "SSL:SSL,SASL_SSL:SASL_SSL,"
            keystore = self._keystore()
            for name in ("ssl", "sasl_ssl"):
                more += [
                    f"listener.name.{name}.ssl.keystore.type=PEM",
                    f"listener.name.{name}.ssl.keystore.location={keystore}",
                    f"listener.name.{name}.ssl.truststore.type=PEM",
                    f"listener.name.{name}.ssl.truststore.location={self.tls.ca}",
                ]
            more += [
                "listener.name.ssl.ssl.client.auth=required",
                "listener.name.ssl.ssl.principal.mapping.rules=RULE:^CN=([^,]*).*$/$1/,DEFAULT",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            ]
        return {
            "more_listeners": listeners,
            "more_advertised": "," + listeners.rstrip(","),
            "more_protocols": protocols,
            "more": "\n".join(more),
        }

    def _keystore(self) -> Path:
        """Kafka's PEM key store: the key, then the certificate, in one file."""
        assert self.tls is not None
        store = self.tls.key.with_suffix(".keystore.pem")
        store.write_bytes(self.tls.key.read_bytes() + self.tls.cert.read_bytes())
        store.chmod(0o600)
        return store

    def format_args(self) -> list[str]:
        """The storage format's arguments that make the users' SCRAM credentials."""
        return [
            arg
            for name, password in self.users.items()
            for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")
        ]


NO_SASL = {"more_listeners": "", "more_advertised": "", "more_protocols": "", "more": ""}


@dataclass
class LocalKafka(_Server):
    """Apache Kafka, single-node KRaft, from the cached jars; with `sasl`, also a listener whose
    clients log in and meet Kafka's ACLs."""

    port: int = 9092
    controller_port: int = 9093
    heap: str = "-Xms256m -Xmx768m"
    sasl: SaslListener | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> None:
        java, libs = ensure_java(), ensure_kafka_jars()
        data = self.folder / "data"
        props = self.folder / "server.properties"
        props.parent.mkdir(parents=True, exist_ok=True)
        props.write_text(
            _local_file("server.properties").format(
                port=self.port,
                controller_port=self.controller_port,
                data_dir=data,
                **(NO_SASL if self.sasl is None else self.sasl.properties()),
            ),
            encoding="utf-8",
        )
        log4j = self.folder / "log4j2.properties"
        log4j.write_text(_local_file("log4j2.properties"), encoding="utf-8")
        for busy in (self.port, self.controller_port, *([] if self.sasl is None else self.sasl.ports())):
            if not port_bindable(busy):
                raise StackError(f"port {busy} is taken: stop what listens there or pick other ports")
        classpath = f"{libs}/*"
        if not (data / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            # "=": an id that starts with "-" (base64url can) would read as an option
            argv = [java, "-cp", classpath, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}"]
            argv += [] if self.sasl is None else self.sasl.format_args()
            _run_quiet([*argv, "-c", str(props), "--standalone"], "formatting Kafka storage", timeout=120)
        jvm = [*self.heap.split(), "-Djava.awt.headless=true", "-XX:+UseG1GC"]
        jvm += [f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.file={self.folder / 'server.log'}"]
        self._spawn([java, *jvm, "-cp", classpath, "kafka.Kafka", str(props)])
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Until the broker answers a metadata request (an open port is not enough)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if port_open(self.port) and kafka_answers(self.bootstrap):
                return
            time.sleep(0.3)
        raise StackError(f"Kafka did not answer on {self.bootstrap} within {timeout:.0f}s; see {self.folder}")


def kafka_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000})
    try:
        return bool(admin.list_topics(timeout=timeout).brokers)
    except Exception:  # noqa: BLE001 - any failure means "not yet"; the caller retries until its deadline
        return False


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a TLS server: its certificate and key (also good as a client's, for the
    server's own checks and tools) and the authority whose certificates its clients must show."""

    ca: Path
    cert: Path
    key: Path

    def redis_args(self) -> list[str]:
        """redis-server's options: TLS only (no plain port), client certificates required."""
        return ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
                "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "yes"]  # fmt: skip

    def redis_cli_args(self) -> list[str]:
        return ["--tls", "--cacert", str(self.ca), "--cert", str(self.cert), "--key", str(self.key)]

    def redis_kwargs(self) -> dict[str, Any]:
        """A redis-py client's, as the server itself."""
        return {"ssl": True, "ssl_ca_certs": str(self.ca), "ssl_certfile": str(self.cert),
                "ssl_keyfile": str(self.key)}  # fmt: skip


@dataclass
class LocalRedis(_Server):
    """redis-server on loopback; `persist` keeps data across restarts (append-only file); with
    `tls`, its port speaks TLS only and wants a client certificate."""

    port: int = 6379
    persist: bool = False
    extra: tuple[str, ...] = ()  # more redis-server options (a cluster node's: rankstream/cluster.py)
    tls: TlsFiles | None = None

    @property
    def url(self) -> str:
        return f"{'redis' if self.tls is None else 'rediss'}://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> None:
        binary = ensure_redis_server()
        if not port_bindable(self.port):
            raise StackError(f"port {self.port} is taken: stop what listens there or pick another port")
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = [binary, "--bind", "127.0.0.1", "--daemonize", "no"]
        if self.tls is None:
            argv += ["--port", str(self.port)]
        else:
            argv += ["--port", "0", "--tls-port", str(self.port), *self.tls.redis_args()]
        argv += ["--dir", str(self.folder), "--logfile", str(self.folder / "redis.log"), "--save", ""]
        argv += ["--appendonly", "yes" if self.persist else "no"]
        # big keys (a million-member rolling period expiring, a reset) are freed off Redis' thread
        argv += [
            "--lazyfree-lazy-expire",
            "yes",
            "--lazyfree-lazy-user-del",
            "yes",
            "--lazyfree-lazy-server-del",
            "yes",
        ]
        self._spawn([*argv, *self.extra])
        deadline = time.monotonic() + timeout
        client = self.client(socket_connect_timeout=0.5)
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if client.ping():
                    client.close()
                    return
            except redis.RedisError:
                time.sleep(0.1)
        raise StackError(f"Redis did not answer on port {self.port} within {timeout:.0f}s")

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client of this server (with its own certificate when TLS)."""
        tls = {} if self.tls is None else self.tls.redis_kwargs()
        return redis.Redis(port=self.port, **kwargs, **tls)
