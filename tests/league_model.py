"""An independent model of leagues (docs/leagues.md), written from the contract, not from the
worker: seats, divisions, standings and tiers across seasons, per board.

Events are applied in the order given (the order the worker applied them: one partition's
stream order), each with the season it falls in (None: no season takes it, by its time or the
service's clock) and the seasons before it still kept, newest first. The first incr, set or best
of a member in a season seats them: the next seat of their tier, counted from 0; seat k is in
division k // size + 1. Their tier: the one the latest of those earlier seasons they sat in
ended them in (promoted if their final rank in their division is within the tier's promotion,
else demoted if within its demotion from the bottom; kept without a score there), the entry
tier if none. A season is final once the next one seats a member, or once a member returning
from it is seated: its later events count nowhere in the league. A delete or erase removes the
member's score and keeps their seat. Inside a division, members rank by score in the board's
order, then by seat.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LeagueRules:
    division_size: int
    tiers: tuple[str, ...]  # lowest first
    entry_tier: str
    desc: bool = True
    # tier -> ("c", count) or ("f", fraction) of a division's members with a score
    promote: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    demote: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    rewards_top: int = 0


@dataclass(frozen=True)
class LeagueEvent:
    board: str
    member: str
    op: str  # incr | set | best | delete | erase
    score: float
    season: str | None  # the season it counts in (None: none takes it)
    id: str = ""
    earlier: tuple[str, ...] = ()  # the seasons before `season` still kept, newest first


@dataclass
class SeasonModel:
    seats: dict[str, tuple[str, int]] = field(default_factory=dict)  # member -> (tier, order)
    taken: dict[str, int] = field(default_factory=dict)  # tier -> seats taken
    scores: dict[str, float] = field(default_factory=dict)  # member -> score (absent: none)
    sealed: bool = False

    def standings(self, tier: str, number: int, rules: LeagueRules) -> list[tuple[str, float]]:
        """A division's members with a score, best first."""
        members = [
            m
            for m, (t, order) in self.seats.items()
            if t == tier and order // rules.division_size + 1 == number and m in self.scores
        ]
        sign = -1 if rules.desc else 1
        members.sort(key=lambda m: (sign * self.scores[m], self.seats[m][1]))
        return [(m, self.scores[m]) for m in members]

    def divisions(self, tier: str, rules: LeagueRules) -> int:
        return -(-self.taken.get(tier, 0) // rules.division_size)

    def outcome(self, member: str, rules: LeagueRules) -> tuple[str, int | None]:
        """(the tier the member ends this season in, their final rank in their division)."""
        tier, order = self.seats[member]
        if member not in self.scores:
            return tier, None
        standings = [m for m, _ in self.standings(tier, order // rules.division_size + 1, rules)]
        rank, n, t = standings.index(member) + 1, len(standings), rules.tiers.index(tier)
        if t < len(rules.tiers) - 1 and rank <= _moved(rules.promote.get(tier), n):
            return rules.tiers[t + 1], rank
        if t > 0 and rank > n - _moved(rules.demote.get(tier), n):
            return rules.tiers[t - 1], rank
        return tier, rank


def _moved(rule: tuple[str, float] | None, members: int) -> int:
    if rule is None:
        return 0
    kind, value = rule
    return min(int(value), members) if kind == "c" else int(value * members)


@dataclass
class LeagueModel:
    rules: LeagueRules
    seasons: dict[tuple[str, str], SeasonModel] = field(default_factory=dict)
    seen: set[tuple[str, str]] = field(default_factory=set)  # (board, id) applied

    def season(self, board: str, season: str) -> SeasonModel:
        return self.seasons.setdefault((board, season), SeasonModel())

    def apply(self, events: Iterable[LeagueEvent]) -> None:
        for ev in events:
            if ev.id:
                if (ev.board, ev.id) in self.seen:
                    continue
                self.seen.add((ev.board, ev.id))
            if ev.season is None:
                continue
            s = self.season(ev.board, ev.season)
            if s.sealed:
                continue
            if ev.op in ("delete", "erase"):
                if ev.member in s.seats:
                    s.scores.pop(ev.member, None)
                continue
            if ev.member not in s.seats:
                self._seat(ev, s)
            old = s.scores.get(ev.member)
            if ev.op == "incr":
                s.scores[ev.member] = (old or 0.0) + ev.score
            elif ev.op == "set" or old is None or ((ev.score > old) if self.rules.desc else (ev.score < old)):
                s.scores[ev.member] = ev.score

    def _seat(self, ev: LeagueEvent, s: SeasonModel) -> None:
        if ev.earlier:
            self.season(ev.board, ev.earlier[0]).sealed = True
        tier = self.rules.entry_tier
        for earlier in ev.earlier:
            was = self.season(ev.board, earlier)
            if ev.member in was.seats:
                was.sealed = True
                tier = was.outcome(ev.member, self.rules)[0]
                break
        order = s.taken.get(tier, 0)
        s.taken[tier] = order + 1
        s.seats[ev.member] = (tier, order)
