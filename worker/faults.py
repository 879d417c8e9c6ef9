"""What stops a partition and what does not: the one place that tells an infrastructure fault
(pause, back off, retry the batch) from a failure of one message (dead-letter it with
`internal_error` and move on). A full, read-only, loading, busy or moving Redis is
infrastructure: dead-lettering everything while Redis is full would lose the stream."""

from __future__ import annotations

import redis
from confluent_kafka import KafkaException

from common.errors import RankstreamError

# Reply codes that say "Redis can't take writes right now", not "this input is bad".
_REDIS_TRANSIENT_CODES = frozenset(
    {"OOM", "READONLY", "LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "MASTERDOWN",
     "MISCONF", "NOREPLICAS", "NOAUTH", "WRONGPASS", "NOPERM", "UNBLOCKED"}
)  # fmt: skip
_REDIS_TRANSIENT_CLASSES = (
    redis.ConnectionError,  # also BusyLoadingError (LOADING)
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterError,
    redis.exceptions.ClusterDownError,  # also MasterDownError
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,  # also MovedError (its subclass); the parser drops the code from the text
    redis.exceptions.AuthenticationError,
    redis.exceptions.NoPermissionError,
    # the cluster client's own (not RedisErrors): no node reachable, a slot not served while a
    # master fails over (SlotNotCoveredError), the slot map not agreeing yet
    redis.exceptions.RedisClusterException,
)


# a script meeting a key of its slot on the other master while the slot moves (Redis Cluster)
_REDIS_TRANSIENT_TEXT = ("non local key",)


def is_infrastructure(exc: BaseException) -> bool:
    """True: retry the batch after a back-off. False: the message that raised it is poison."""
    if isinstance(exc, RankstreamError):
        return exc.retriable
    if isinstance(exc, (KafkaException, OSError, *_REDIS_TRANSIENT_CLASSES)):
        return True
    if isinstance(exc, redis.ResponseError):
        # redis-py maps some codes to classes; others (BUSY, MISCONF) stay in the message
        code = str(exc).split(" ", 1)[0]
        return code in _REDIS_TRANSIENT_CODES or any(t in str(exc) for t in _REDIS_TRANSIENT_TEXT)
    return False
