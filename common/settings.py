"""The one frozen settings model, read from the environment (CONTRACT section 7).

Every `RANKSTREAM_*` variable must be a known setting or a `RANKSTREAM_KAFKA_<key>`
librdkafka pass-through; anything else is a typo and stops the process with one line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from common.errors import ConfigError

KAFKA_LOG = logging.getLogger("librdkafka")

ENV_PREFIX = "RANKSTREAM_"
KAFKA_PASSTHROUGH_PREFIX = "RANKSTREAM_KAFKA_"
# librdkafka keys whose values are credentials: kept as SecretStr so they never print.
_SECRET_MARKERS = ("password", "secret", "key.pem", "token")


class Settings(BaseModel):
    """Process configuration. Defaults point at the local stack (`rankstream stack up`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    # true: RANKSTREAM_REDIS_URL names any node of a Redis Cluster (database 0); every client
    # discovers the others and follows MOVED/ASK (common/clients.py, common/store/cluster.py)
    redis_cluster: bool = False
    # > 0: before committing a batch the worker waits until every master has this many replicas
    # holding its writes (WAIT), so a failover loses nothing committed (common/store/replicas.py)
    redis_wait_replicas: int = Field(default=0, ge=0, le=16)
    redis_wait_timeout_ms: int = Field(default=1_000, ge=1, le=4_000)  # below the 5 s socket timeout
    boards: Path = Path("boards.yaml")
    topic_updates: str = "update_rank"
    topic_dlq: str = "update_rank.dlq"
    topic_cache: str = "update_cache"
    topic_results: str = "rank_period_closed"  # period results (CONTRACT 6; worker/results.py)
    worker_group: str = "rankstream-worker"
    # This worker's name in its transactional.id (`<group>-<worker_id>`); default
    # `<hostname>-<pid>`: in a pod that is the pod name and pid 1, stable across container
    # restarts, so a restarted worker aborts its predecessor's open transaction at once.
    worker_id: str = Field(default="", pattern=r"^[A-Za-z0-9._-]{0,200}$")
    # Prefix of every Redis key: lets several deployments (or tests) share one Redis.
    key_prefix: str = "rs:"
    # The id window (CONTRACT 2): the same (board, id) produced again less than this after it was
    # applied is dropped as a producer duplicate. Redelivery never depends on it (offset fences).
    id_window_s: int = Field(default=3600, ge=1, le=30 * 86_400)
    # The previous release's per-event dedupe records lived this long; while its boards are adopted
    # (for one id window after the upgrade) the worker honours and writes them with this TTL.
    dedupe_window_s: int = Field(default=7 * 24 * 3600, ge=60)
    # New general window instances keep a tie index (README "Boards"); false: a state hash, as
    # releases before the tie index wrote, for a rolling upgrade from one (README "Upgrading").
    tie_index: bool = True
    # Latest accepted event time = now + this (CONTRACT 2); also bounds the API's at= and period=.
    max_future_skew_s: int = Field(default=86_400, ge=0, le=366 * 86_400)
    worker_batch_size: int = Field(default=5000, ge=1, le=100_000)
    worker_batch_timeout_ms: int = Field(default=50, ge=1, le=60_000)
    worker_http_port: int = Field(default=8081, ge=0, le=65535)
    # How long a starting worker waits for Kafka to answer (its transactional id registered)
    # before it exits 1 with one line; its pod then restarts with back-off.
    worker_start_timeout_s: float = Field(default=30.0, gt=0, le=600)
    # The board state a worker keeps to decide events itself (README "Where the work happens"):
    # at most this many (member, window period) entries; 0 = Redis decides every event (apply.lua).
    worker_state_cells: int = Field(default=1_000_000, ge=0, le=100_000_000)
    shutdown_deadline_s: float = Field(default=20.0, gt=0)
    api_host: str = "0.0.0.0"  # noqa: S104 - a server in a pod listens on every interface
    api_port: int = Field(default=8080, ge=0, le=65535)
    # The warm cache of non-hot boards' answers (api/warm.py): the MiB of answers it keeps (0:
    # off), and how often a node checks the seq of the boards it keeps (the bound on staleness
    # when a change notice is lost).
    warm_cache_mb: int = Field(default=64, ge=0, le=64 * 1024)
    warm_check_s: float = Field(default=1.0, gt=0, le=60)
    # Deprecated: the 1 s TTL cache the warm cache replaced. Accepted so deployments that set it
    # still start; 0 turns the warm cache off (as it turned the TTL cache off), other values do
    # nothing.
    top_cache_ttl_s: float = Field(default=1.0, ge=0)
    log_level: str = "INFO"
    # Tests only: the service clock is this file's (common/clock.py ClockFile), read at every call,
    # not the system's. Never set in a deployment.
    test_clock_file: Path | None = None
    # librdkafka pass-through: RANKSTREAM_KAFKA_SASL_MECHANISMS=PLAIN -> sasl.mechanisms=PLAIN
    kafka: Mapping[str, str | SecretStr] = Field(default_factory=dict)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"unknown log level {value!r}")
        return upper

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


def _known_env_names() -> set[str]:
    return {ENV_PREFIX + name.upper() for name in Settings.model_fields if name != "kafka"}


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
        where = ENV_PREFIX + ".".join(str(p) for p in first["loc"]).upper()
        raise ConfigError(f"{where}: {first['msg']}") from None
