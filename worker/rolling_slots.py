"""Which instances of a rolling window `last_<N><unit>` an event touches (docs/internals/rolling-windows.md).

A rolling window's period q (named by its newest bucket) sums the buckets q-N+1..q: calendar
periods of its unit. In Redis each bucket b is a hash (the member's board over b's events alone)
and each period a board of its own. An event whose bucket is b writes, per rolling window:
  - its bucket b (role BUCKET): the event's delta in the window is the bucket's change;
  - the current period and closed ones still taking late events whose windows hold b (DELTA);
  - the next period, cur+1, prepared ahead (DERIVED: R[cur] - B[cur-N+1] + B[cur+1], absolute,
    so it is exact whether or not worker/rolling.py has reached the member yet), once its
    preparation began (apply.lua checks its marker). Its inputs ride in the call without
    counting the event (`deps`).
So an event costs at most three writes per rolling window (its bucket, the current period and,
late in the bucket, from the claim, the next) plus one per closed period within late grace. A
bucket further ahead than cur+1 (the allowed clock skew) is only stored: it enters the periods
when worker/rolling.py prepares them.
A delete (and an erase) takes the member out of every bucket that may still be read and of every
period still taking events: its call holds them all (`wide`)."""

from __future__ import annotations

from dataclasses import dataclass
from zoneinfo import ZoneInfo

from common.boards import BoardType, Window, WindowKind
from common.periods import Period, PeriodCache, expire_at_ms, shift
from common.store.apply import BUCKET, DELTA, DERIVED, Instance, Rolling
from common.store.keys import bucket_instance, window_instance
from common.windows import ROLLING_UNITS


def unit_window(unit: str) -> Window:
    """A window of the unit (h, d, w, m): its bucket math is the unit's calendar's."""
    assert unit in ROLLING_UNITS
    return Window(f"last_1{unit}", WindowKind.ROLLING, 1, unit)


@dataclass(frozen=True, slots=True)
class RollingPlan:
    counted: list[Instance]  # in the event's mask
    deps: list[Instance]  # in the call only: what the derived period reads
    dues: tuple[Period, ...]  # the buckets during which the board's next period must be prepared
    bucket: Period | None  # the event's bucket (None: too late to count anywhere)


class RollingSlots:
    """Rolling window instances for events and controls, on the config's zone."""

    def __init__(self, tz: ZoneInfo) -> None:
        self._tz = tz
        self._periods = PeriodCache(tz)

    def bucket_at(self, window: Window, ts_ms: int) -> Period:
        period = self._periods.at(window, ts_ms)
        assert period is not None  # every instant has a calendar period
        return period

    def shift(self, window: Window, period: Period, n: int) -> Period:
        return shift(window, period, n, self._tz)

    def bucket_expire_ms(self, board_type: BoardType, window: Window, bucket: Period) -> int:
        """A bucket is read until the last period holding it (N-1 later) closes and its late
        grace passes; it is kept one bucket longer."""
        return self.shift(window, bucket, window.count).end_ms + board_type.late_grace_ms

    def period_instance(
        self, board_type: BoardType, window: Window, period: Period, role: str, *, sealable: bool = False
    ) -> Instance:
        """`sealable`: a period whose result is emitted, so it may be sealed (apply.lua reads its
        marker, and leaves it alone once sealed); never the next one, which is not closed before
        it becomes current."""
        expire = self._expire(board_type, window, period)
        link = Rolling(role, window.name)
        return Instance(window_instance(window.name, period.id), expire, None, link, sealable)

    def bucket(self, board_type: BoardType, window: Window, bucket: Period) -> Instance:
        return _bucket(window, bucket, self.bucket_expire_ms(board_type, window, bucket))

    def buckets_before(
        self, board_type: BoardType, window: Window, newest: Period, *, while_live: int | None = None
    ) -> list[Instance]:
        """Buckets from `newest` back, in linear time (each one's expiry walks along with it): the
        window's N of them, or with `while_live` (now) every one not yet expired."""
        out: list[Instance] = []
        bucket, last_holder = newest, self.shift(window, newest, window.count)  # expiry: its end + grace
        while True:
            expire = last_holder.end_ms + board_type.late_grace_ms
            if len(out) == window.count if while_live is None else while_live >= expire:
                return out
            out.append(_bucket(window, bucket, expire))
            bucket, last_holder = self.shift(window, bucket, -1), self.shift(window, last_holder, -1)

    def derived(self, board_type: BoardType, window: Window, cur: Period) -> tuple[Instance, list[Instance]]:
        """Period cur+1, derived from cur: the instance and what it reads."""
        following = self.shift(window, cur, 1)
        source = self.period_instance(board_type, window, cur, DELTA, sealable=results_of(board_type, window))
        leaving = self.bucket(board_type, window, self.shift(window, cur, 1 - window.count))
        entering = self.bucket(board_type, window, following)
        keep_from = self.shift(window, cur, 2 - window.count).start_ms  # N = 1: the following bucket
        expire = self._expire(board_type, window, following)
        link = Rolling(DERIVED, window.name, source.name, leaving.name, entering.name, keep_from)
        return Instance(window_instance(window.name, following.id), expire, None, link), [
            source,
            leaving,
            entering,
        ]

    def taking(self, board_type: BoardType, window: Window, cur: Period, now: int) -> list[Period]:
        """The periods still taking events, newest first: the next (prepared ahead), the current
        and closed ones within late grace that have not expired."""
        out = [self.shift(window, cur, 1), cur]
        period = self.shift(window, cur, -1)
        while now < min(period.end_ms + board_type.late_grace_ms, self._expire(board_type, window, period)):
            out.append(period)
            period = self.shift(window, period, -1)
        return out

    def _expire(self, board_type: BoardType, window: Window, period: Period) -> int:
        return expire_at_ms(window, period, board_type.retention[window.name], self._tz)

    def for_event(self, board_type: BoardType, window: Window, ts: int, now: int) -> RollingPlan:
        cur, bucket = self.bucket_at(window, now), self.bucket_at(window, ts)
        if now >= self.bucket_expire_ms(board_type, window, bucket):
            return RollingPlan([], [], (), None)  # so late that every period holding it is closed
        counted = [self.bucket(board_type, window, bucket)]
        deps: list[Instance] = []
        oldest_holder = self.shift(window, bucket, window.count - 1)  # the last period holding it
        reach = False  # the current or the next period holds it
        for period in self.taking(board_type, window, cur, now):
            if period.start_ms < bucket.start_ms:
                break
            if period.start_ms > oldest_holder.start_ms:
                continue
            reach = reach or period.start_ms >= cur.start_ms
            if period.start_ms > cur.start_ms:
                instance, deps = self.derived(board_type, window, cur)
                counted.append(instance)
            else:
                sealable = results_of(board_type, window)
                counted.append(self.period_instance(board_type, window, period, DELTA, sealable=sealable))
        following = self.shift(window, cur, 1)
        # the walk that prepares the next period carries what it wrote: now, and in the next bucket
        dues: tuple[Period, ...] = (cur, following) if reach else ()
        if bucket.start_ms > following.start_ms:
            dues = (self.shift(window, bucket, -1),)  # its period is prepared the bucket before
        return RollingPlan(counted, deps, dues, bucket)

    def holders(self, board_type: BoardType, window: Window, bucket: Period, now: int) -> list[Period]:
        """The periods holding `bucket` (it and the N-1 after it) still taking events at `now`."""
        out = []
        period = bucket
        for _ in range(window.count):
            if now < period.end_ms + board_type.late_grace_ms:
                out.append(period)
            period = self.shift(window, period, 1)
        return out

    def live_buckets(self, board_type: BoardType, window: Window, now: int, latest: int) -> list[Instance]:
        """Every bucket that may hold data and still be read: from the newest an event may name
        (`latest`) back to the oldest not yet expired."""
        return self.buckets_before(board_type, window, self.bucket_at(window, latest), while_live=now)

    def for_control(
        self, board_type: BoardType, window: Window, periods: list[tuple[Period, int]], now: int, latest: int
    ) -> list[Instance]:
        """An erase's or reset's: the periods it names (with their expiry) and every live bucket
        (a rolling window is reset whole: its periods are sums of the same buckets)."""
        link = Rolling(DELTA, window.name)
        named = [Instance(window_instance(window.name, p.id), expire, None, link) for p, expire in periods]
        return named + self.live_buckets(board_type, window, now, latest)

    def for_delete(self, board_type: BoardType, window: Window, now: int, latest: int) -> list[Instance]:
        """A delete's: every period still taking events and every live bucket."""
        cur = self.bucket_at(window, now)
        results = results_of(board_type, window)
        periods = [
            self.period_instance(
                board_type, window, p, DELTA, sealable=results and p.start_ms <= cur.start_ms
            )
            for p in self.taking(board_type, window, cur, now)
        ]
        return periods + self.live_buckets(board_type, window, now, latest)


def results_of(board_type: BoardType, window: Window) -> bool:
    """Does the type emit the window's period results (worker/results.py)?"""
    return board_type.results is not None and window.name in board_type.results.windows


def _bucket(window: Window, bucket: Period, expire: int) -> Instance:
    return Instance(bucket_instance(window.name, bucket.id), expire, None, Rolling(BUCKET, window.name))
