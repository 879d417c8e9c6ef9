"""The one frozen settings model, read from the environment (docs/contract.md §7).

Every `RANKSTREAM_*` variable must be a known setting or a `RANKSTREAM_KAFKA_<key>`
librdkafka pass-through; anything else is a typo and stops the process with one line.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from common.errors import ConfigError
from common.store.tls import RedisTls

KAFKA_LOG = logging.getLogger("librdkafka")

ENV_PREFIX = "RANKSTREAM_"
KAFKA_PASSTHROUGH_PREFIX = "RANKSTREAM_KAFKA_"
# librdkafka keys whose values are credentials: kept as SecretStr so they never print.
_SECRET_MARKERS = ("password", "secret", "key.pem", "token")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Topic defaults (rankstream/topics.py imports them: this is their one home).
UPDATES_PARTITIONS = 6
CACHE_PARTITIONS = 6
RESULTS_PARTITIONS = 3
MAX_PARTITIONS = 10_000
MAX_REPLICATION = 32_767  # Kafka's replication factor is a 16-bit field
DAY_MS = 86_400_000
MIN_RETENTION_MS = 3_600_000  # shorter: surely seconds written for milliseconds
_RETENTION_ALLOWED = f"`-1` (forever), or an integer at least {MIN_RETENTION_MS} (1 hour)"


def _retention(value: int) -> int:
    if value != -1 and value < MIN_RETENTION_MS:
        raise ValueError(f"must be -1 (forever) or at least {MIN_RETENTION_MS} ms (1 hour), got {value}")
    return value


# the bounds each kind of topic setting shares, in one place
Partitions = Annotated[int, Field(ge=1, le=MAX_PARTITIONS)]
Replicas = Annotated[int, Field(ge=1, le=MAX_REPLICATION)]
RetentionMs = Annotated[
    int, AfterValidator(_retention), Field(json_schema_extra={"allowed": _RETENTION_ALLOWED})
]


class Settings(BaseModel):
    """Process configuration. Defaults point at the local stack (`rankstream stack up`), but for
    the topics' replication, which suits a production cluster (the local stack overrides it).

    Every field's `description` is written for users: docs/configuration.md is generated from
    them (`python -m common.settings_doc`), and a unit test fails when the two differ."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kafka_bootstrap: str = Field(
        default="127.0.0.1:9092",
        description="Kafka bootstrap servers (librdkafka's `bootstrap.servers`): `host:port`, several "
        "separated by commas.",
    )
    redis_url: SecretStr = Field(
        default=SecretStr("redis://127.0.0.1:6379/0"),
        description="Redis URL, credentials included (`redis://:<password>@host:6379/0`, `rediss://` "
        "for TLS); a secret: never logged. With `RANKSTREAM_REDIS_CLUSTER=true`: any node of the "
        "cluster (database 0).",
    )
    # common/store/tls.py
    redis_tls_ca_file: Path | None = Field(
        default=None,
        description="With a `rediss://` URL: the PEM file of the certificate authorities that sign "
        "the Redis servers' certificates. Every connection (worker, API, commands, each node of a "
        "cluster) verifies the server's certificate and name against it. Unset: the system's "
        "trust store.",
    )
    redis_tls_cert_file: Path | None = Field(
        default=None,
        description="With a `rediss://` URL: the PEM certificate every connection presents to Redis, "
        "for servers that require one (`tls-auth-clients yes`). Set with "
        "`RANKSTREAM_REDIS_TLS_KEY_FILE`.",
    )
    redis_tls_key_file: Path | None = Field(
        default=None,
        description="The private key (PEM, not encrypted) of `RANKSTREAM_REDIS_TLS_CERT_FILE`; keep "
        "it in a mounted secret.",
    )
    # common/clients.py, common/store/cluster.py
    redis_cluster: bool = Field(
        default=False,
        description="`true`: Redis is a Redis Cluster. `RANKSTREAM_REDIS_URL` names any node "
        "(database 0); every process discovers the others from it and follows slots as they move "
        "(MOVED/ASK). See [scaling out](deploy/scaling.md).",
    )
    # common/store/replicas.py
    redis_wait_replicas: int = Field(
        default=0,
        ge=0,
        le=16,
        description="Greater than 0: before committing a batch the worker waits (Redis `WAIT`) until "
        "every master has this many replicas holding its writes, so a failover loses nothing "
        "committed; fewer within `RANKSTREAM_REDIS_WAIT_TIMEOUT_MS`: the batch is not committed but "
        "retried. `0`: the worker does not wait.",
    )
    redis_wait_timeout_ms: int = Field(
        default=1_000,
        ge=1,
        le=4_000,  # below the 5 s socket timeout
        description="How long the worker waits for the replicas `RANKSTREAM_REDIS_WAIT_REPLICAS` asks "
        "for (milliseconds); fewer confirmations within it: the batch is retried, not committed. At "
        "most 4000, below the 5 s timeout of the worker's Redis connections.",
    )
    boards: Path = Field(
        default=Path("boards.yaml"),
        description="The board config file (YAML; see [board types](boards.md)). `make` sets "
        "`deploy/boards.yaml`, the container image `/etc/rankstream/boards.yaml`.",
    )
    topic_updates: str = Field(
        default="update_rank",
        description="Kafka topic of the update events the workers consume.",
    )
    topic_dlq: str = Field(
        default="update_rank.dlq",
        description="Kafka topic the worker dead-letters events to that can never be applied, each "
        "with its reason.",
    )
    topic_cache: str = Field(
        default="update_cache",
        description="Compacted Kafka topic of the hot boards' member states: the workers publish it, "
        "every API node replays it before it is ready.",
    )
    # docs/contract.md §6; worker/results.py
    topic_results: str = Field(
        default="rank_period_closed",
        description="Kafka topic each closed period's final standings go to, once, for the boards "
        "that declare `period_results` (see [period results](period-results.md)).",
    )
    # rankstream/topics.py: what `rankstream topics` creates, and checks existing topics against
    topic_replication: Replicas = Field(
        default=3,
        description="Replication factor of the topics `rankstream topics` creates (each partition on "
        "this many brokers). The default suits a cluster of 3 or more brokers; the local stack and "
        "the tests use 1. More than the brokers the cluster reports is refused with one line "
        "(status 2). See [topics](operations/topics.md).",
    )
    topic_min_insync_replicas: Replicas = Field(
        default=2,
        description="`min.insync.replicas` of the topics `rankstream topics` creates: a write with "
        "`acks=all` (the workers' writes, and producers set up as [producing](producing.md) says) is "
        "acknowledged only once this many replicas have it, so one broker lost loses nothing "
        "acknowledged. At most `RANKSTREAM_TOPIC_REPLICATION`; the local stack and the tests use 1.",
    )
    topic_updates_partitions: Partitions = Field(
        default=UPDATES_PARTITIONS,
        description="Partitions of `update_rank` (`RANKSTREAM_TOPIC_UPDATES`): the most workers that "
        "apply events at once. Partitions can be added later, never removed; see "
        "[topics](operations/topics.md#adding-partitions-to-update_rank) for what that does to "
        "ordering and offset fences.",
    )
    topic_updates_retention_ms: RetentionMs = Field(
        default=7 * DAY_MS,
        description="How long `update_rank` keeps events (`retention.ms`, milliseconds; `-1`: "
        "forever). `rankstream recover` re-reads `update_rank` from the offsets a restored Redis "
        "holds, so keep it longer than the age of your oldest usable Redis backup plus the time to "
        "notice a loss and restore it.",
    )
    topic_dlq_partitions: Partitions = Field(
        default=1,
        description="Partitions of the dead-letter topic (`RANKSTREAM_TOPIC_DLQ`): one keeps the dead "
        "letters in the order they were written.",
    )
    topic_dlq_retention_ms: RetentionMs = Field(
        default=30 * DAY_MS,
        description="How long the dead-letter topic keeps its records (`retention.ms`, milliseconds; "
        "`-1`: forever): the time you have to read a dead letter, fix its cause and produce it "
        "again.",
    )
    # rankstream/dlq/ledger.py: what `rankstream dlq replay` sent, so nothing is sent twice
    topic_dlq_replayed: str = Field(
        default="update_rank.dlq.replayed",
        description="Compacted Kafka topic where `rankstream dlq replay` records each dead letter it "
        "produced again, in the same transaction as the event, so no dead letter is replayed twice "
        "(see [dead letters](operations/dead-letters.md)).",
    )
    topic_dlq_replayed_partitions: Partitions = Field(
        default=1,
        description="Partitions of the replay ledger (`RANKSTREAM_TOPIC_DLQ_REPLAYED`). Compacted, so "
        "it has no time retention: a dead letter stays recorded as replayed for as long as the "
        "dead-letter topic can hold it.",
    )
    topic_cache_partitions: Partitions = Field(
        default=CACHE_PARTITIONS,
        description="Partitions of `update_cache` (`RANKSTREAM_TOPIC_CACHE`): an API node replays "
        "only its hot boards' partitions. Compacted, so it has no time retention. Never add "
        "partitions to an existing one: API nodes would replay a partial board (to change the count, "
        "see [topics](operations/topics.md#update_cache)).",
    )
    topic_results_partitions: Partitions = Field(
        default=RESULTS_PARTITIONS,
        description="Partitions of `rank_period_closed` (`RANKSTREAM_TOPIC_RESULTS`); each period's "
        "result goes to the partition of its key.",
    )
    topic_results_retention_ms: RetentionMs = Field(
        default=30 * DAY_MS,
        description="How long `rank_period_closed` keeps a result (`retention.ms`, milliseconds; "
        "`-1`: forever); compaction also keeps only the latest record of each period meanwhile.",
    )
    worker_group: str = Field(
        default="rankstream-worker",
        description="The workers' Kafka consumer group; also the start of their transactional ids "
        "(`<group>-<worker id>`).",
    )
    worker_id: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9._-]{0,200}$",
        description="This worker's name in its Kafka transactional id (`<group>-<worker id>`). Empty "
        "(the default): `<hostname>-<pid>`; in a Kubernetes pod that is the pod name and pid 1, "
        "stable across container restarts, so a restarted worker aborts its predecessor's open "
        "transaction at once (the Kubernetes manifest sets the pod name).",
    )
    key_prefix: str = Field(
        default="rs:",
        description="Prefix of every Redis key: lets several deployments (or tests) share one Redis. "
        "It must not contain `{` or `}`.",
        json_schema_extra={"allowed": "string without `{` or `}`"},
    )
    # docs/contract.md §2
    id_window_s: int = Field(
        default=3600,
        ge=1,
        le=30 * 86_400,
        description="The id window (seconds): the same (board, id) produced again less than this "
        "after it was applied is dropped as a producer duplicate. Redelivery never depends on it "
        "(offset fences). See [delivery guarantees](guarantees.md).",
    )
    dedupe_window_s: int = Field(
        default=7 * 24 * 3600,
        ge=60,
        description="Only while adopting a Redis written by a build before 0.1.0 (before offset "
        "fences; for one id window after the upgrade): the TTL (seconds) of its per-event id "
        "records, which the worker honours and writes meanwhile. The default is that build's own.",
    )
    tie_index: bool = Field(
        default=True,
        description="`true`: new general window instances keep a tie index. `false`: they get a state "
        "hash instead, as releases before the tie index wrote: for a rolling upgrade from one (see "
        "[upgrading](operations/upgrading.md)).",
    )
    cache_record_format: Literal[1, 2] = Field(
        default=2,
        description="The `update_cache` record format workers write. `2`: a member's meta in a "
        "record of its own, states in 25 bytes. `1`: what releases before it write and read: keep "
        "it while API nodes of such a release still run (see [upgrading](operations/upgrading.md)).",
    )
    # docs/contract.md §2
    max_future_skew_s: int = Field(
        default=86_400,
        ge=0,
        le=366 * 86_400,
        description="Latest accepted event time: the Kafka message's timestamp (now, when that is not "
        "plausible) plus this many seconds; a later event is dead-lettered. Also bounds the API's "
        "`at=` and `period=` (now plus this).",
    )
    worker_batch_size: int = Field(
        default=5000,
        ge=1,
        le=100_000,
        description="Most messages a worker applies as one batch: what is already fetched, up to this "
        "many, never waiting to fill it. A larger batch gives each board more events per Redis "
        "call, each of which has a fixed cost.",
    )
    worker_batch_timeout_ms: int = Field(
        default=50,
        ge=1,
        le=60_000,
        description="How long a worker waits for the first message of a batch (milliseconds); the "
        "rest of the batch is what is already fetched.",
    )
    worker_http_port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="Port of the worker's probes (`/livez`, `/readyz`) and `/metrics`.",
    )
    worker_start_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="How long a starting worker waits for Kafka to answer (its transactional id "
        "registered) before it exits with status 1 and one error line; its pod then restarts with "
        "back-off.",
    )
    # worker/boardstate.py; 0: apply.lua decides every event
    worker_state_cells: int = Field(
        default=1_000_000,
        ge=0,
        le=100_000_000,
        description="How many (member, window period) states a worker keeps to decide events itself, "
        "least recently used boards out first; `0`: Redis decides every event, as in release 0.1.0 "
        "(see [the write path](internals/write-path.md)).",
    )
    shutdown_deadline_s: float = Field(
        default=20.0,
        gt=0,
        description="On SIGTERM, every blocking call after it is bounded by this (seconds) and the "
        "process exits within it: keep Kubernetes' `terminationGracePeriodSeconds` above it "
        "(see [shutdown](operations/shutdown.md)).",
    )
    api_host: str = Field(
        default="0.0.0.0",  # noqa: S104 - a server in a pod listens on every interface
        description="Address the API node listens on (`0.0.0.0`: every interface).",
    )
    api_port: int = Field(
        default=8080,
        ge=0,
        le=65535,
        description="Port of the API node's public HTTP server (the board routes, the board page, "
        "`/livez` and `/readyz`); also the one `rankstream top` and `rankstream member` ask by "
        "default.",
    )
    api_admin_port: int = Field(
        default=8082,
        ge=0,
        le=65535,
        description="Port of the API node's admin HTTP server: `/metrics` and `/openapi.json`, and "
        "`/livez` and `/readyz` as on the public port. Keep it off the public network: expose "
        "only `RANKSTREAM_API_PORT` (see [security](operations/security.md)).",
    )
    # Who may read, and how much: api/access.py (docs/operations/security.md)
    api_read_tokens: SecretStr = Field(
        default=SecretStr(""),
        description="Bearer tokens, separated by commas, one of which every board read on the public "
        "port must carry (`Authorization: Bearer <token>`; 401 otherwise). Empty: reads are open. "
        "A secret: never logged.",
    )
    api_admin_tokens: SecretStr = Field(
        default=SecretStr(""),
        description="Bearer tokens, separated by commas, that also read, and that alone may ask for "
        "`nocache=1` and look up more than `RANKSTREAM_API_PUBLIC_LOOKUP_MAX` members at once (403 "
        "otherwise). Empty: anyone may. A secret: never logged.",
    )
    api_public_lookup_max: int = Field(
        default=100,
        ge=1,
        le=500,
        description="With `RANKSTREAM_API_ADMIN_TOKENS` set: the most members a lookup without an "
        "admin token may name.",
    )
    api_cors_origins: str = Field(
        default="",
        description="Browser origins allowed to read the API from their pages, separated by commas "
        "(`https://game.example.com`), or `*` for any: their answers carry "
        "`Access-Control-Allow-Origin` and their preflight requests are answered. Empty: none.",
    )
    api_rate_limit_per_s: float = Field(
        default=0.0,
        ge=0.0,
        description="Board reads a client may make per second on the public port, on average (a token "
        "bucket); more are answered 429 with `Retry-After`. The client is its bearer token, else "
        "its address (see `RANKSTREAM_API_TRUSTED_PROXIES`). `0`: no limit.",
    )
    api_rate_limit_burst: int = Field(
        default=20,
        ge=1,
        description="How many reads a client may make at once above its rate (the bucket's size).",
    )
    api_stream_max: int = Field(
        default=10_000,
        ge=0,
        description="The most live event streams (`GET /v1/boards/{board}/events`) one API node holds "
        "at once; beyond, a new one is answered 503 `too_many_streams` (0: streams are off).",
    )
    api_stream_keepalive_s: float = Field(
        default=15.0,
        gt=0,
        le=300,
        description="Seconds between the keep-alive comments an idle event stream is sent, so that "
        "proxies keep it open and a client that left is noticed.",
    )
    api_trusted_proxies: str = Field(
        default="",
        description="Addresses or networks (CIDR), separated by commas, of the proxies in front of the "
        "API (a CDN, a load balancer): a request from one is counted as the first address of "
        "`X-Forwarded-For`, from the right, that is not one of them. Empty: the peer's address.",
    )
    # The warm cache: api/warm.py
    warm_cache_mb: int = Field(
        default=64,
        ge=0,
        le=64 * 1024,
        description="MiB of answers of non-hot boards an API node keeps in memory until their board "
        "changes (the least recently used go first); `0` turns the warm cache off. See "
        "[the read path](internals/read-path.md).",
    )
    warm_check_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="How often (seconds) an API node compares the seq of the boards it keeps answers "
        "of with Redis: the bound on staleness when a change notice is lost.",
    )
    http_max_age_s: int = Field(
        default=1,
        ge=0,
        description="`Cache-Control: max-age` of read answers (seconds): how long a browser or a "
        "CDN may serve one without asking again. Viewers of a live room poll every second or two. "
        "See [HTTP caching](http-api.md#caching).",
    )
    http_stale_while_revalidate_s: int = Field(
        default=5,
        ge=0,
        description="`stale-while-revalidate` of read answers (seconds): how long after max-age a "
        "cache may still serve one while it asks again in the background.",
    )
    hot_promote_reads_per_s: float = Field(
        default=0.0,
        ge=0,
        description="Reads per second (over about 10 s) at which an API node makes a board hot by "
        "itself: it loads the board into memory while Redis keeps answering, and serves it from "
        "memory once it holds it exactly. `0`: only the boards listed under `hot` are. Every worker "
        "must run this release first (see "
        "[boards that turn hot](hot-boards.md#boards-that-turn-hot-by-themselves)).",
    )
    hot_idle_s: float = Field(
        default=300.0,
        gt=0,
        description="A board an API node made hot by itself is dropped from its memory once its "
        "reads per second, averaged over about this many seconds, fall below a quarter of "
        "`RANKSTREAM_HOT_PROMOTE_READS_PER_S`.",
    )
    hot_promote_max_boards: int = Field(
        default=16,
        ge=0,
        description="How many boards an API node makes hot by itself at most (the most read first).",
    )
    hot_promote_max_members: int = Field(
        default=1_000_000,
        gt=0,
        description="A board holding more member states than this, counted over every window period "
        "a node would load (a member in 3 of them counts 3 times), is not made hot by itself: it "
        "stays in Redis.",
    )
    top_cache_ttl_s: float = Field(
        default=1.0,
        ge=0,
        description="Deprecated: the 1 s TTL cache the warm cache replaced. Accepted so deployments "
        "that set it still start; `0` turns the warm cache off (as it turned the TTL cache off), "
        "other values do nothing.",
    )
    log_level: str = Field(
        default="INFO",
        description="Level of the logs: JSON lines on stderr, librdkafka's own lines among them "
        "(logger `librdkafka`, served when the client polls).",
        json_schema_extra={"allowed": ", ".join(f"`{level}`" for level in LOG_LEVELS) + " (any case)"},
    )
    # common/clock.py ClockFile
    test_clock_file: Path | None = Field(
        default=None,
        description="Tests only, never in a deployment: the service clock (periods, closed windows, "
        "activity ends) is read from this file, which a test writes, at every call, not from the "
        "system; a warning at start says it is in effect.",
    )
    # librdkafka pass-through: RANKSTREAM_KAFKA_SASL_MECHANISMS=PLAIN -> sasl.mechanisms=PLAIN
    kafka: Mapping[str, str | SecretStr] = Field(
        default_factory=dict,
        description="librdkafka pass-through settings, from the `RANKSTREAM_KAFKA_<KEY>` variables: "
        "`_` becomes `.`, the key is lower-cased; keys naming credentials are kept secret.",
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in LOG_LEVELS:
            raise ValueError(f"unknown log level {value!r}")
        return upper

    @model_validator(mode="after")
    def _min_insync_within_replication(self) -> Settings:
        if self.topic_min_insync_replicas > self.topic_replication:
            raise ValueError(
                f"{ENV_PREFIX}TOPIC_MIN_INSYNC_REPLICAS: {self.topic_min_insync_replicas} is more than "
                f"{ENV_PREFIX}TOPIC_REPLICATION ({self.topic_replication}): no write with acks=all "
                "could ever succeed"
            )
        return self

    @field_validator("api_trusted_proxies")
    @classmethod
    def _networks(cls, value: str) -> str:
        for part in comma_list(value):
            try:
                ipaddress.ip_network(part, strict=False)
            except ValueError:
                raise ValueError(f"{part!r} is not an address or network") from None
        return value

    @model_validator(mode="after")
    def _admin_port_apart(self) -> Settings:
        if self.api_admin_port == self.api_port != 0:
            raise ValueError(
                f"RANKSTREAM_API_ADMIN_PORT is RANKSTREAM_API_PORT ({self.api_port}): the admin "
                "routes need a port of their own"
            )
        return self

    @model_validator(mode="after")
    def _redis_url_and_tls(self) -> Settings:
        url = self.redis_url.get_secret_value()
        if urlsplit(url).query:  # read by redis-py, not by the API's connection: refused by all
            raise ValueError(
                "RANKSTREAM_REDIS_URL: options after '?' are not read; set TLS files with "
                "RANKSTREAM_REDIS_TLS_CA_FILE, _CERT_FILE and _KEY_FILE"
            )
        scheme = url.partition("://")[0]
        names = [env_name(f) for f in ("redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file")]
        files = [self.redis_tls_ca_file, self.redis_tls_cert_file, self.redis_tls_key_file]
        given = [name for name, file in zip(names, files, strict=True) if file is not None]
        if given and scheme != "rediss":
            raise ValueError(f"{given[0]} is set but RANKSTREAM_REDIS_URL is {scheme}://: use rediss://")
        if (self.redis_tls_cert_file is None) != (self.redis_tls_key_file is None):
            raise ValueError(f"{names[1]} and {names[2]} go together: set both or neither")
        return self

    def redis_tls(self) -> RedisTls:
        """What a `rediss://` connection verifies and presents (common/store/tls.py)."""
        files = (self.redis_tls_ca_file, self.redis_tls_cert_file, self.redis_tls_key_file)
        return RedisTls(*(None if f is None else str(f) for f in files))

    @field_validator("key_prefix")
    @classmethod
    def _prefix_has_no_braces(cls, value: str) -> str:
        # braces would shift the Redis Cluster hash tag away from the board
        if "{" in value or "}" in value:
            raise ValueError("must not contain '{' or '}'")
        return value

    def librdkafka(
        self, extra: Mapping[str, Any] | None = None, defaults: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The librdkafka config: `defaults` (which pass-through keys may override), bootstrap,
        pass-through keys (secrets revealed), then `extra` (what rankstream's correctness needs).
        librdkafka's own log lines go to the `librdkafka` logger (the process' JSON lines), served
        by the client's poll/consume, instead of raw lines on stderr from its threads."""
        conf: dict[str, Any] = {**(defaults or {}), "bootstrap.servers": self.kafka_bootstrap}
        for key, value in self.kafka.items():
            conf[key] = value.get_secret_value() if isinstance(value, SecretStr) else value
        conf.update(extra or {})
        conf["logger"] = KAFKA_LOG
        return conf


def _passthrough(environ: Mapping[str, str]) -> dict[str, str | SecretStr]:
    out: dict[str, str | SecretStr] = {}
    for name, value in environ.items():
        if not name.startswith(KAFKA_PASSTHROUGH_PREFIX) or name == "RANKSTREAM_KAFKA_BOOTSTRAP":
            continue
        key = name[len(KAFKA_PASSTHROUGH_PREFIX) :].lower().replace("_", ".")
        secret = any(marker in key for marker in _SECRET_MARKERS)
        out[key] = SecretStr(value) if secret else value
    return out


def comma_list(text: str) -> list[str]:
    """The items of a setting that lists several, separated by commas (blanks around them and
    empty items left out)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def env_name(field: str) -> str:
    """The environment variable of settings field `field` (`topic_replication` ->
    `RANKSTREAM_TOPIC_REPLICATION`): the one rule the loader, the docs and the error lines use."""
    return ENV_PREFIX + field.upper()


def _known_env_names() -> set[str]:
    return {env_name(name) for name in Settings.model_fields if name != "kafka"}


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read settings from `environ` (default os.environ); raise ConfigError with one line."""
    env = dict(os.environ if environ is None else environ)
    known = _known_env_names()
    unknown = sorted(
        name
        for name in env
        if name.startswith(ENV_PREFIX)
        and name not in known
        and not name.startswith(KAFKA_PASSTHROUGH_PREFIX)
        and not name.startswith("RANKSTREAM_TEST_")  # test-suite switches, read by tests/
    )
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {
        name[len(ENV_PREFIX) :].lower(): value for name, value in env.items() if name in known
    }
    values["kafka"] = _passthrough(env)
    values.update(overrides)
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:  # a rule across settings: its message names them
            raise ConfigError(first["msg"].removeprefix("Value error, ")) from None
        where = ENV_PREFIX + ".".join(str(p) for p in first["loc"]).upper()
        raise ConfigError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
