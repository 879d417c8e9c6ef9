"""The one Redis key schema. Every key of a board carries the hash tag `{<board>}`, so a
board lives in one Cluster slot and one script may touch all of it.

    <prefix>{<board>}:seq              board sequence number (bumped per applied event)
    <prefix>{<board>}:meta             hash member -> meta JSON (latest wins)
    <prefix>{<board>}:z:<instance>     ranking zset (score, tie-encoded member), top max_members
    <prefix>{<board>}:o:<instance>     overflow zset: members beyond max_members (same encoding)
    <prefix>{<board>}:t:<instance>     tie index directory (common/store/lua/tieindex.lua): with
    <prefix>{<board>}:t:<instance>:<d>:<p>  its buckets, hash member -> tie ms, it finds a member's
                                       entry in the zsets, whose score is its exact score
    <prefix>{<board>}:h:<instance>     the previous release's hash member -> "<score>|<tie ms>",
                                       kept by an instance that has one in place of a tie index
    <prefix>{<board>}:p:<instance>     a packed window's ranking zset (packed score, member id):
                                       a type with a declared score range (common/store/packing.py)
    <prefix>{<board>}:q:<instance>     its overflow zset (max_members); a packed window has no :t:
    <prefix>{<board>}:fence            hash: `e` -> the epoch the board was written in; per source
                                       `<topic>:<partition>` -> "<topic id>|<offset>|<array index+1>"
                                       of the last event applied, and `<source>!r` -> positions the
                                       script rejected since the source's last commit (apply.lua)
    <prefix>{<board>}:b:<window>:<bucket id>  a rolling window's bucket: hash member ->
                                       "<value>|<latest event ms>" (worker/rolling_slots.py)
    <prefix>{<board>}:rp:<instance>    the period's marker: "done" once the rolling period
                                       <instance> is prepared from the one before it
                                       (worker/rolling.py); "busy:<owner>" while a worker prepares
                                       it. Then its result's state (worker/results.py): "sealed"
                                       (events no longer change it), "sending:<partition>:<offset>",
                                       or "sent:<partition>:<offset>:<seq>:<emitted at>"; it
                                       expires with the period
    <prefix>{<board>}:r:<instance>     the board seq of the instance's latest reset (`rankstream
                                       reset`), expiring with it: what a redelivered reset
                                       re-publishes to update_cache
    <prefix>{<board>}:i                id window directory (common/lua/idwindow.lua)
    <prefix>{<board>}:i:<d>:<p>        id window bucket: zset id fingerprint -> applied-at second
    <prefix>{<board>}:id:<event id>    the previous release's per-event dedupe record: read (and
                                       written) only while adopting that release's boards
    <prefix>{<board>}:moving           never written: declared by every apply.lua call, so a call whose
                                       slot is migrating is refused (TRYAGAIN) on both masters
    <prefix>{<board>}:lg:<season>:s    a league season's seats: hash member -> "<tier>:<order>" (common/
                                       league.py; common/store/lua/place.lua gives them out)
    <prefix>{<board>}:lg:<season>:n    and its seats taken: hash tier -> count; both expire with the season
                                       (place.lua builds the names of earlier seasons' seats,
                                       divisions and markers from the board's stem)
    <prefix>{<board>}:hot              set once the board's state is backfilled into update_cache
    <prefix>{<board>}:hot:lock         held by the worker backfilling it

<instance> is `total` or `<window>:<period id>` (`day:2026-11-22`, `week:2026-W47`), or for a
league's division `season:<period id>@<tier>.<n>` (`season:s7@gold.3`: common/league.py).

    <prefix>{rolling}:<unit>:<bucket id>  set of the boards whose rolling windows of that unit
                                       need their next period prepared during that bucket
    <prefix>{rolling}:<unit>:ready:<bucket id>  every board due before it was prepared for it
    <prefix>{rolling}:<window>          zset board -> start ms of its newest bucket with an event
    <prefix>{rolling}:<unit>:since      start ms of the first bucket a worker prepared in

    <prefix>{shards}                    hash board type -> its shards (`shards: K`) as written
                                       at its boards' first write (common/store/shardcount.py)
    <prefix>{shards}:moving             hash board type -> "<from> <to>" while `rankstream
                                       reshard-board` moves it (rankstream/reshard.py)

    <prefix>{results}:due               zset "<board>|<window>|<period>" -> when its result is due
                                       (the period's end + late grace + a settle margin)
    <prefix>{results}:emitter           the worker that emits results: its transactional id, a lease

    <prefix>{s<n>}:slot                a slot's mark, in each of the 16,384 slots of a cluster (the tag
                                       <s<n>> picks the slot): its absence tells a lost slot from a
                                       new board (common/store/slotmarks.py)
    <prefix>{s<n>}:wait                a probe written before WAIT on each master (RANKSTREAM_REDIS_
                                       WAIT_REPLICAS: common/store/replicas.py); expires in 60 s

    <prefix>changes                    a pub/sub channel, not a key: "<seq before> <seq after>
                                       <board>" for each apply call that changed a board

    <prefix>{owners:<group>}:<topic>   hash partition -> transactional id of the worker that
                                       last took it (worker/fencing.py)
    <prefix>{sources:<group>}:<topic>  hash: `epoch` -> this Redis dataset's epoch; per partition
                                       "<topic id>|<last offset applied>" (worker/sources.py);
                                       `legacy_until` -> ms until which the previous release's
                                       dedupe records are honoured
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from common.league import DIVISION_MARK

TOTAL_INSTANCE = "total"


# A period's tie index is thousands of small keys on a big board; expiring all of them at one
# instant blocks Redis' expire cycle for milliseconds (small keys are freed inline, lazyfree or
# not). Each index key expires up to this long after its period instead (tieindex.lua), spread
# by a hash of its name; nothing reads an index after its period expired.
INDEX_EXPIRY_SPREAD_MS = 60_000
_SLOT_PRIME = 16_777_213  # xhash.lua XH.string_slot: djb2 modulo the largest prime below 2^24


@lru_cache(maxsize=200_000)
def string_slot(s: str) -> int:
    """xhash.lua XH.string_slot: where a member id (or a key) falls in an xhash directory."""
    h = 5381
    for byte in s.encode():
        h = (h * 33 + byte) % _SLOT_PRIME
    return h


def index_expiry(expire_at_ms: int, key: str) -> int:
    """When a tie index key of a period expiring at `expire_at_ms` expires (0: never)."""
    if expire_at_ms == 0:
        return 0
    return expire_at_ms + string_slot(key) % INDEX_EXPIRY_SPREAD_MS


BUCKET_PREFIX = "b~"  # a rolling bucket's instance name: never a window's (no `:` before it)


def bucket_instance(window: str, bucket: str) -> str:
    """The instance name of a rolling window's bucket in an apply.lua call: `b~last_7d:2026-11-22`."""
    return f"{BUCKET_PREFIX}{window}:{bucket}"


def window_instance(window: str, period: str | None) -> str:
    """`total` for the total window, `<window>:<period id>` for a calendar period."""
    return TOTAL_INSTANCE if period is None else f"{window}:{period}"


def changes_channel(prefix: str) -> str:
    """apply.lua publishes "<seq before> <seq after> <board>" here when a call changed a board:
    API nodes drop what they cached of it (api/warm.py)."""
    return f"{prefix}changes"


@dataclass(frozen=True, slots=True)
class BoardKeys:
    prefix: str
    board: str

    @property
    def tag(self) -> str:
        return f"{self.prefix}{{{self.board}}}"

    @property
    def seq(self) -> str:
        return f"{self.tag}:seq"

    @property
    def changes(self) -> str:
        """The pub/sub channel of changed boards (not a key; one for every board of the prefix)."""
        return changes_channel(self.prefix)

    @property
    def meta(self) -> str:
        return f"{self.tag}:meta"

    def rank(self, instance: str, packed: bool = False) -> str:
        return f"{self.tag}:{'p' if packed else 'z'}:{instance}"

    def overflow(self, instance: str, packed: bool = False) -> str:
        return f"{self.tag}:{'q' if packed else 'o'}:{instance}"

    def state(self, instance: str) -> str:
        return f"{self.tag}:h:{instance}"

    def bucket(self, instance: str) -> str:
        """A rolling bucket's hash, from its instance name (bucket_instance)."""
        return f"{self.tag}:b:{instance.removeprefix(BUCKET_PREFIX)}"

    def prepared(self, instance: str) -> str:
        """The period's marker; a league division's is its season's (sealing the season seals
        every division of it at once)."""
        return f"{self.tag}:rp:{instance.partition(DIVISION_MARK)[0]}"

    def tie_index(self, instance: str) -> str:
        return f"{self.tag}:t:{instance}"

    @property
    def fence(self) -> str:
        return f"{self.tag}:fence"

    def reset_mark(self, instance: str) -> str:
        return f"{self.tag}:r:{instance}"

    @property
    def id_window(self) -> str:
        return f"{self.tag}:i"

    def legacy_id(self, event_id: str) -> str:
        return f"{self.tag}:id:{event_id}"

    @property
    def moving(self) -> str:
        """Never written: apply.lua declares it so that no call runs while the slot migrates."""
        return f"{self.tag}:moving"

    def seats(self, season_instance: str) -> str:
        """A league season's seats (`season_instance`: `season:<period id>`): member -> seat."""
        return f"{self.tag}:lg:{season_instance}:s"

    def seats_taken(self, season_instance: str) -> str:
        """A league season's seats taken per tier (how many divisions each has opened)."""
        return f"{self.tag}:lg:{season_instance}:n"

    @property
    def stem(self) -> str:
        """What every key name of the board starts with (place.lua builds some from it)."""
        return f"{self.tag}:"

    @property
    def hot_ready(self) -> str:
        return f"{self.tag}:hot"

    @property
    def hot_lock(self) -> str:
        return f"{self.tag}:hot:lock"

    @property
    def promoted(self) -> str:
        """While it exists (an API node keeps it, with a TTL: common/store/promotion.py), every
        write to the board reports its states so the worker publishes them to update_cache, as
        for a hot board of the config; its value names the registration."""
        return f"{self.tag}:promoted"

    def instance_pattern(self, window: str, packed: bool) -> str:
        """SCAN pattern of the keys that name every period of a calendar window Redis holds: its
        ranking zsets (an instance with members has one: max_members keeps the best there)."""
        return f"{self.rank(window, packed)}:*"


def rolling_due(prefix: str, unit: str, bucket: str) -> str:
    """The boards whose rolling windows of `unit` (h, d, w, m) need their next period prepared
    while `bucket` is current (worker/rolling.py)."""
    return f"{prefix}{{rolling}}:{unit}:{bucket}"


def rolling_boards(prefix: str, window: str) -> str:
    """Every board with events in a rolling window: zset board -> the start ms of the newest
    bucket holding one (worker/rolling.py catches them up after an outage)."""
    return f"{prefix}{{rolling}}:{window}"


def rolling_ready(prefix: str, unit: str, bucket: str) -> str:
    """Set once every board due in the bucket before `bucket` has its period `bucket` prepared."""
    return f"{prefix}{{rolling}}:{unit}:ready:{bucket}"


def rolling_since(prefix: str, unit: str) -> str:
    """The start ms of the first bucket in which a worker prepared rolling periods of `unit`."""
    return f"{prefix}{{rolling}}:{unit}:since"


def partition_owners(prefix: str, group: str, topic: str) -> str:
    """Which worker (transactional id) last took each partition of `topic` in `group`."""
    return f"{prefix}{{owners:{group}}}:{topic}"


def partition_sources(prefix: str, group: str, topic: str) -> str:
    """The epoch and, per partition of `topic`, the last offset `group` applied (worker/sources.py)."""
    return f"{prefix}{{sources:{group}}}:{topic}"


def hot_flagged(prefix: str) -> str:
    """Set of the boards whose backfill flag (BoardKeys.hot_ready) is set: what a worker checks
    against its config at start, to drop the flags of boards no longer hot (worker/backfill.py)."""
    return f"{prefix}{{hot}}:flagged"


def shard_counts(prefix: str) -> str:
    """Hash board type -> the shards its boards were first written with (common/store/shardcount.py)."""
    return f"{prefix}{{shards}}"


def shard_moves(prefix: str) -> str:
    """Hash board type -> "<from> <to>" while `rankstream reshard-board` moves the type's boards
    (rankstream/reshard.py): a run stopped before it recorded the new count starts over."""
    return f"{prefix}{{shards}}:moving"


def results_due(prefix: str) -> str:
    """Every period whose result is not yet emitted: zset `<board>|<window>|<period>` -> due ms."""
    return f"{prefix}{{results}}:due"


def results_emitter(prefix: str) -> str:
    """The lease of the one worker emitting period results (worker/results.py)."""
    return f"{prefix}{{results}}:emitter"


def replica_probe(prefix: str, tag: str) -> str:
    """A key written on one master right before WAIT (common/store/replicas.py); `tag` picks
    its slot (topology.slot_tag)."""
    return f"{prefix}{{{tag}}}:wait"


def slot_mark(prefix: str, tag: str) -> str:
    """The mark of the slot `tag` hashes to (common/store/slotmarks.py)."""
    return f"{prefix}{{{tag}}}:slot"
