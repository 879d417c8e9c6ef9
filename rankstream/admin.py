"""`rankstream erase` and `rankstream reset`: what an operator does to a board while events keep
flowing. Each produces one control message (common/control.py) on update_rank, keyed by the
board, so the worker applies it in order with the board's events, exactly once (the board's
offset fence), and publishes what hot nodes need in the same transaction. Then, unless told not
to, it waits until the worker group committed past it, and says whether it was applied (the
board's fence shows it) or dead-lettered (rankstream/outcome.py).

erase  <board> <member>                 the member leaves every window instance and the meta
reset  <board> [--window W [--period P]] the whole board (its meta too), one window, or one period
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from confluent_kafka.admin import AdminClient

from common.boards import BoardsConfig, BoardType, load_boards
from common.clients import kafka_producer, redis_client
from common.control import (
    Message,
    check_board,
    check_member,
    control_message,
    parse_selector,
    reset_selector,
)
from common.errors import BadEvent, ConfigError, InfrastructureError, RankstreamError
from common.events import Op
from common.settings import Settings
from common.store.encoding import text
from common.store.keys import BoardKeys
from common.store.shards import shard_names, shard_of
from rankstream.outcome import dead_letter_reason, wait_handled
from worker.sources import describe_topic

DELIVERY_TIMEOUT_S = 30.0
_P = ParamSpec("_P")
_T = TypeVar("_T")


class UsageError(ConfigError):
    """A bad argument (board, member, window, period): one line, exit 2, nothing produced."""


class NotAppliedError(RankstreamError):
    """The message is on the topic, but no worker applied it within the wait."""


def erase(settings: Settings, board: str, member: str, wait_s: float | None) -> str:
    """Erase `member` from `board`; the line to print. `wait_s` None: don't wait for the worker."""
    board_type = board_type_of(load_boards(settings.boards), board)
    _checked(check_member, member)
    message = control_message(Op.ERASE, board, member=member)
    where = (shard_of(board, board_type.shards, member),)  # a sharded board: the member's shard
    return _send(settings, board, message, f"erased {member!r} from {board}", wait_s=wait_s, fences=where)


def reset(
    settings: Settings, board: str, window: str | None, period: str | None, wait_s: float | None
) -> str:
    """Empty `board`, one window of it, or one period; the line to print."""
    boards = load_boards(settings.boards)
    board_type = board_type_of(boards, board)
    selector = _checked(reset_selector, boards, board_type, window, period)
    window, period = parse_selector(selector)  # the period's canonical id
    message = control_message(Op.RESET, board, window=window, period=period)
    if window is None:
        what = f"reset {board}"
    elif period is None:
        what = f"reset window {window} of {board}"
    else:
        what = f"reset {selector} of {board}"
    return _send(settings, board, message, what, wait_s=wait_s, fences=shard_names(board, board_type.shards))


def board_type_of(boards: BoardsConfig, board: str) -> BoardType:
    """The board's type; a malformed id or an unknown type is a UsageError (exit 2)."""
    return _checked(check_board, boards, board)


def _checked(check: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`check(*args)`, its BadEvent as a UsageError (the worker refuses the same things)."""
    try:
        return check(*args, **kwargs)
    except BadEvent as exc:
        raise UsageError(exc.message) from None


def _send(
    settings: Settings,
    board: str,
    message: Message,
    what: str,
    *,
    wait_s: float | None,
    fences: Sequence[str],
) -> str:
    """Produce `message` (acknowledged by every in-sync replica), then wait for the worker to
    apply it: `fences`, the names in Redis whose fences show it (a sharded board's shards)."""
    value, headers = message
    topic = settings.topic_updates
    producer = kafka_producer(settings, {"enable.idempotence": True, "acks": "all"})
    delivered: list[tuple[Any, Any]] = []
    producer.produce(
        topic,
        value=value,
        key=board.encode(),
        headers=headers,
        on_delivery=lambda e, m: delivered.append((e, m)),
    )
    producer.flush(DELIVERY_TIMEOUT_S)
    if not delivered:
        late = f"did not acknowledge the message within {DELIVERY_TIMEOUT_S:.0f} s"
        raise InfrastructureError(f"Kafka at {settings.kafka_bootstrap} {late}")
    error, msg = delivered[0]
    if error is not None:
        raise InfrastructureError(f"Kafka refused the message: {error.str()}")
    partition, offset = int(msg.partition()), int(msg.offset())
    where = f"{topic}[{partition}] offset {offset}"
    if wait_s is None:
        return f"{what}: produced at {where} (not waiting for the worker)"
    if not wait_handled(settings, partition, offset, wait_s):
        raise NotAppliedError(
            f"{what}: produced at {where}, but no worker handled it within {wait_s:g} s "
            "(it stays on the topic: a worker applies it when it gets there)"
        )
    reason = dead_letter_reason(settings, partition, offset, int(msg.timestamp()[1]))
    if reason is not None:
        raise NotAppliedError(f"{what}: NOT applied, the worker dead-lettered it ({reason}) at {where}")
    if not all(_fence_passed(settings, name, partition, offset) for name in fences):
        raise NotAppliedError(f"{what}: handled at {where}, but the board's fence in Redis does not show it")
    return f"{what}: applied (at {where})"


def _fence_passed(settings: Settings, name: str, partition: int, offset: int) -> bool:
    """The fence of a board (or shard) for the partition, of this very topic (its id), reached `offset`."""
    topic = settings.topic_updates
    topic_id, _ = describe_topic(AdminClient(settings.librdkafka()), topic)
    client = redis_client(settings)
    try:
        raw = text(client.hget(BoardKeys(settings.key_prefix, name).fence, f"{topic}:{partition}"))
    finally:
        client.close()
    if raw is None:  # "<topic id>|<offset>|<where>" (apply.lua)
        return False
    found_id, found, _ = raw.split("|")
    return found_id == topic_id and int(found) >= offset
