"""`rankstream dlq stats | show | replay`: the arguments checked (a bad one is one line, exit 2,
before Kafka is asked anything), then the action."""

from __future__ import annotations

import sys
from contextlib import closing
from pathlib import Path
from typing import TextIO

from common.events import Reason
from common.settings import Settings
from rankstream.admin import UsageError
from rankstream.dlq.replay import Options, replay
from rankstream.dlq.report import dead_letters, entry_json, entry_text, stats_json, stats_table, tally

REASONS = tuple(sorted(r.value for r in Reason))


def checked_reason(reason: str | None) -> str | None:
    if reason is not None and reason not in REASONS:
        raise UsageError(f"--reason: no dead-letter reason {reason!r} (reasons: {', '.join(REASONS)})")
    return reason


def checked_limit(limit: str | None) -> int | None:
    if limit is None:
        return None
    if not limit.isdigit() or int(limit) < 1:
        raise UsageError(f"--limit must be a whole number, 1 or more, got {limit!r}")
    return int(limit)


def stats(settings: Settings, as_json: bool, out: TextIO = sys.stdout) -> int:
    found, topic = tally(dead_letters(settings)), settings.topic_dlq
    print(stats_json(found, topic) if as_json else stats_table(found, topic), file=out)
    return 0


def show(
    settings: Settings, reason: str | None, limit: int | None, as_json: bool, out: TextIO = sys.stdout
) -> int:
    """Each selected dead letter: a JSON line each with --json, else a block each."""
    shown = 0
    with closing(dead_letters(settings, reason)) as letters:
        for letter in letters:
            if limit is not None and shown >= limit:
                break
            text = entry_json(letter) if as_json else ("\n" if shown else "") + entry_text(letter)
            print(text, file=out)
            shown += 1
    if not shown and not as_json:
        which = f" with reason {reason}" if reason else ""
        print(f"{settings.topic_dlq}: no dead letters{which}", file=out)
    return 0


def run(
    settings: Settings,
    action: str,
    *,
    reason: str | None = None,
    limit: str | None = None,
    as_json: bool = False,
    fix_with: str | None = None,
    dry_run: bool = False,
    force: bool = False,
) -> int:
    """The `rankstream dlq <action>` the arguments name; its exit status."""
    chosen, most = checked_reason(reason), checked_limit(limit)
    if action == "stats":
        return stats(settings, as_json)
    if action == "show":
        return show(settings, chosen, most, as_json)
    options = Options(chosen, None if fix_with is None else Path(fix_with), dry_run, force, most)
    return replay(settings, options)
