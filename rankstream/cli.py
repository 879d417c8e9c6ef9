"""The `rankstream` command: the two processes, the local stack, and tools for people."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import KafkaError, KafkaException

from common.clients import is_authorization, kafka_error
from common.errors import ConfigError, InfrastructureError, RankstreamError, StackError, TopicsDifferError
from common.logs import setup_logging
from common.memory import keep_big_buffers_unmapped
from common.settings import Settings, load_settings
from rankstream.show import ApiAnswerError


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from worker.main import run_worker

    keep_big_buffers_unmapped()
    return run_worker(settings)


def _api(args: argparse.Namespace, settings: Settings) -> int:
    from api.main import run_api

    keep_big_buffers_unmapped()
    return run_api(settings)


def _topics(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.topics import ensure_topics

    created = ensure_topics(settings)
    print(f"topics ready ({', '.join(created) or 'all existed'} created)")
    return 0


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.devstack import choose_stack

    stack = choose_stack(args.engine, Path(args.dir), args.kafka_port, args.redis_port)
    if args.action == "prepare":
        print(stack.prepare())
    elif args.action == "up":
        stack.up(settings)
        print(f"kafka {stack.kafka_bootstrap}  redis {stack.redis_url}  logs+data {stack.folder}")
    elif args.action == "down":
        stack.down()
        print("stack stopped")
    else:
        print(stack.status())
    return 0


def _dev(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.devstack import choose_stack, run_dev

    stack = choose_stack(args.engine, Path(args.dir), args.kafka_port, args.redis_port)
    return run_dev(stack, settings, events_per_s=args.rate)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.demo import run_demo_producer

    return run_demo_producer(settings, events_per_s=args.rate, duration_s=args.duration)


def _backfill(args: argparse.Namespace, settings: Settings) -> int:
    from common.boards import load_boards
    from common.clients import kafka_producer, redis_client
    from worker.main import cache_publisher

    boards = load_boards(settings.boards)
    producer = kafka_producer(settings, {"enable.idempotence": True, "acks": "all"})
    publisher = cache_publisher(settings, boards, producer, redis_client(settings))
    print(f"hot boards backfilled: {', '.join(h.board for h in boards.hot) or 'none configured'} "
          f"({publisher.published} records)")  # fmt: skip
    return 0


def _recover(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.recover import recover

    print("\n".join(recover(settings)))
    return 0


def _accept_redis(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.recover import accept_redis

    print("\n".join(accept_redis(settings)))
    return 0


def _reshard_board(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.reshard import reshard_board

    print("\n".join(reshard_board(settings, args.type, args.shards, keep_old=args.keep_old)))
    return 0


def _erase(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.admin import NotAppliedError, erase

    try:
        print(erase(settings, args.board, args.member, None if args.no_wait else args.timeout))
    except NotAppliedError as exc:
        print(f"rankstream: {exc}", file=sys.stderr)
        return 1
    return 0


def _reset(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.admin import NotAppliedError, reset

    wait_s = None if args.no_wait else args.timeout
    try:
        print(reset(settings, args.board, args.window, args.period, wait_s))
    except NotAppliedError as exc:
        print(f"rankstream: {exc}", file=sys.stderr)
        return 1
    return 0


def _periods(args: argparse.Namespace, settings: Settings) -> int:
    import redis
    from confluent_kafka import KafkaException

    from rankstream.periods import republish, show_periods

    try:
        if args.republish is None:
            print(show_periods(settings, args.board, args.window))
        else:
            print(republish(settings, args.board, args.republish, args.window))
    except (redis.RedisError, KafkaException) as exc:
        raise InfrastructureError(f"rankstream periods: {exc}") from None
    return 0


def _api_url(args: argparse.Namespace, settings: Settings) -> str:
    return str(args.api or f"http://127.0.0.1:{settings.api_port}")


def _top(args: argparse.Namespace, settings: Settings) -> int:
    from api.live import MAX_STREAM_LIMIT
    from rankstream.show import show_top
    from rankstream.watch import watch_top

    if args.watch:
        if args.offset:
            raise ConfigError("rankstream top: --watch shows the top of the board: it takes no --offset")
        if not 1 <= args.limit <= MAX_STREAM_LIMIT:
            raise ConfigError(f"rankstream top: --watch shows 1 to {MAX_STREAM_LIMIT} members (--limit)")
        try:
            return watch_top(_api_url(args, settings), args.board, window=args.window,
                             period=args.period, limit=args.limit)  # fmt: skip
        except (KeyboardInterrupt, BrokenPipeError):
            return 0  # Ctrl-C, or the reader of its output went away (`| head`)
    params = {"window": args.window, "period": args.period, "limit": args.limit, "offset": args.offset}
    print(show_top(_api_url(args, settings), args.board, **params))
    return 0


def _member(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.show import show_member

    params = {"window": args.window, "period": args.period}
    print(show_member(_api_url(args, settings), args.board, args.member, **params))
    return 0


def _dlq(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.dlq.command import run

    return run(
        settings, args.action, reason=getattr(args, "reason", None), limit=getattr(args, "limit", None),
        as_json=getattr(args, "json", False), fix_with=getattr(args, "fix_with", None),
        dry_run=getattr(args, "dry_run", False), force=getattr(args, "force", False),
    )  # fmt: skip


def _capacity(args: argparse.Namespace, settings: Settings) -> int:
    from rankstream.capacity import Figures, load_figures, load_target, plan, render

    target = load_target(args.target)
    figures = load_figures(args.figures) if args.figures else Figures()
    print(render(target, plan(target, figures), figures))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rankstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", help="consume update_rank and apply it to Redis").set_defaults(func=_worker)
    sub.add_parser("api", help="serve the HTTP API").set_defaults(func=_api)
    sub.add_parser(
        "topics", help="create the Kafka topics if missing; fail if existing ones differ from the settings"
    ).set_defaults(func=_topics)
    sub.add_parser(
        "backfill", help="publish hot boards' current state to update_cache (workers also do it at start)"
    ).set_defaults(func=_backfill)

    sub.add_parser(
        "recover",
        help="after restoring Redis from a backup: rewind the workers' group to what Redis holds",
    ).set_defaults(func=_recover)
    sub.add_parser(
        "accept-redis",
        help="start from what Redis holds now (e.g. empty after a loss): unblocks the workers",
    ).set_defaults(func=_accept_redis)
    _reshard_parser(sub)

    erase = sub.add_parser(
        "erase", help="remove a member from every window of a board, and its meta (through the worker)"
    )
    erase.add_argument("board")
    erase.add_argument("member")
    reset = sub.add_parser(
        "reset", help="empty a board, one window of it (--window) or one period (--window --period)"
    )
    reset.add_argument("board")
    reset.add_argument("--window", default=None, help="only this window (total, day, ...)")
    reset.add_argument("--period", default=None, help="only this period of --window (e.g. 2026-11-22)")
    for p in (erase, reset):
        p.add_argument("--no-wait", action="store_true", help="return once Kafka has the message")
        p.add_argument(
            "--timeout",
            type=float,
            default=60.0,
            help="seconds to wait for the worker (default 60)",
        )
    erase.set_defaults(func=_erase)
    reset.set_defaults(func=_reset)

    periods = sub.add_parser(
        "periods", help="a board's closed periods and whether each result was published (period_results)"
    )
    periods.add_argument("board")
    periods.add_argument("--window", default=None, help="only this window (one with period_results)")
    periods.add_argument(
        "--republish", default=None, metavar="PERIOD", help="produce this period's published result again"
    )
    periods.set_defaults(func=_periods)

    stack = sub.add_parser("stack", help="local Kafka + Redis without Docker (prepare | up | down | status)")
    stack.add_argument("action", choices=["prepare", "up", "down", "status"])
    dev = sub.add_parser("dev", help="stack + worker + API + demo producer, until Ctrl-C (make run)")
    for p in (stack, dev):
        p.add_argument("--dir", default=".stack", help="logs and data of the local stack")
        p.add_argument("--kafka-port", type=int, default=9092)
        p.add_argument("--redis-port", type=int, default=6379)
        p.add_argument(
            "--engine",
            choices=["auto", "local", "docker"],
            default="auto",
            help="docker: deploy/compose.yaml; local: Kafka jars + redis-server; auto: docker if it answers",
        )
    stack.set_defaults(func=_stack)
    dev.add_argument("--rate", type=float, default=200.0, help="demo events per second")
    dev.set_defaults(func=_dev)

    _show_parsers(sub)

    _demo_parser(sub)

    _capacity_parser(sub)
    _dlq_parser(sub)
    return parser


def _show_parsers(sub: Any) -> None:
    top = sub.add_parser("top", help="print the top of a board from a running API")
    top.add_argument("board")
    top.add_argument("--limit", type=int, default=10)
    top.add_argument("--offset", type=int, default=0)
    top.add_argument(
        "--watch", action="store_true", help="redraw the table each time the board changes, until Ctrl-C"
    )
    member = sub.add_parser("member", help="print one member's rank from a running API")
    member.add_argument("board")
    member.add_argument("member")
    for p in (top, member):
        p.add_argument("--window", default=None, help="total (default), hour, day, week, month, year")
        p.add_argument("--period", default=None, help="e.g. 2026-11-22; default: the current period")
        p.add_argument(
            "--api", default=None, help="API base URL; default http://127.0.0.1:$RANKSTREAM_API_PORT"
        )
    top.set_defaults(func=_top)
    member.set_defaults(func=_member)


def _demo_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="produce realistic gift events")
    demo.add_argument("--rate", type=float, default=200.0, help="events per second")
    demo.add_argument("--duration", type=float, default=0.0, help="seconds; 0 = until interrupted")
    demo.set_defaults(func=_demo)


def _reshard_parser(sub: Any) -> None:
    reshard = sub.add_parser(
        "reshard-board",
        help="move a board type's boards to another shard count, workers stopped (docs/boards.md#shards)",
    )
    reshard.add_argument("type", help="the board type")
    reshard.add_argument("--shards", type=int, required=True, help="the new shard count (1-64)")
    reshard.add_argument(
        "--keep-old",
        action="store_true",
        help="keep the old layout for API nodes still on the old config; running the command again drops it",
    )
    reshard.set_defaults(func=_reshard_board)


def _capacity_parser(sub: Any) -> None:
    capacity = sub.add_parser("capacity", help="size a deployment for a target load (docs/capacity.md)")
    capacity.add_argument("target", help="the target load, YAML (docs/capacity.md#the-target)")
    capacity.add_argument(
        "--figures", action="append", default=[], metavar="REPORT",
        help="a `make bench` report to take figures from (bench/results/scale.json, worker.json); repeatable",
    )  # fmt: skip
    capacity.set_defaults(func=_capacity)


def _dlq_parser(sub: Any) -> None:
    dlq = sub.add_parser(
        "dlq", help="the dead letters: stats, show, replay fixed ones once (docs/operations/dead-letters.md)"
    )
    actions = dlq.add_subparsers(dest="action", required=True)
    stats = actions.add_parser("stats", help="counts by reason and by hour (UTC)")
    show = actions.add_parser("show", help="each dead letter: place, original bytes, event, headers")
    replay = actions.add_parser(
        "replay", help="produce dead letters to update_rank again with their ids, each once (a ledger)"
    )
    for p in (stats, show):
        p.add_argument("--json", action="store_true", help="JSON (show: one line per dead letter)")
    for p in (show, replay):
        p.add_argument("--reason", default=None, help="only the dead letters of this reason")
        p.add_argument("--limit", default=None, metavar="N", help="at most N (replay: N sent)")
    replay.add_argument(
        "--fix-with", default=None, metavar="FILE.py",
        help="a Python file defining fix(event: dict) -> dict | None, applied before sending (None: skip)",
    )  # fmt: skip
    replay.add_argument("--dry-run", action="store_true", help="print what would be sent; send nothing")
    replay.add_argument(
        "--force", action="store_true",
        help="send even what the ledger says was replayed (counted again once the id window has passed)",
    )  # fmt: skip
    dlq.set_defaults(func=_dlq)


_ACL_HINT = " (what each command needs: docs/operations/requirements.md#kafka-acls)"


def _refusal_line(error: KafkaError) -> str:
    hint = _ACL_HINT if is_authorization(error) else ""
    return f"Kafka refused: {error.str()}{hint}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace, Settings], int] = args.func
    try:
        settings = load_settings()
        setup_logging(settings.log_level)
        return func(args, settings)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        code = _said(exc)
        if code is None:
            raise
        return code


def _said(exc: Exception) -> int | None:
    """An expected failure said in one line (or one per difference): its exit code; None for
    any other exception."""
    if isinstance(exc, TopicsDifferError):  # one line per difference: what to set, or to change
        for line in exc.lines:
            print(f"rankstream: {line}", file=sys.stderr)
        return 1
    if isinstance(exc, ConfigError | StackError | ApiAnswerError):
        print(f"rankstream: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, RankstreamError):
        logging.getLogger("rankstream").error("%s", exc)  # an expected failure, one line
        return 1
    if isinstance(exc, redis.RedisError):  # unreachable, refused (a user without a right), ...
        print(f"rankstream: Redis: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    refused = kafka_error(exc) if isinstance(exc, KafkaException | SystemError) else None
    if refused is None:
        return None
    print(f"rankstream: {_refusal_line(refused)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
