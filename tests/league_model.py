"""An independent model of leagues (docs/contract.md §3), written from the contract, not from
the worker: seats, divisions and their standings, per board and season.

Events are applied in the order given (the order the worker applied them: one partition's
stream order). The first incr, set or best of a member in a season seats them: the next seat of
their tier, counted from 0; seat k is in division k // size + 1. A delete removes the member's
score and keeps their seat. Inside a division, members rank by score in the board's order, then
by seat (join order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LeagueRules:
    division_size: int
    tiers: tuple[str, ...]  # lowest first
    entry_tier: str
    desc: bool = True


@dataclass(frozen=True)
class LeagueEvent:
    board: str
    member: str
    op: str  # incr | set | best | delete | erase
    score: float
    season: str | None  # the season period the event falls in (None: none takes it)
    id: str = ""


@dataclass
class SeasonModel:
    seats: dict[str, tuple[str, int]] = field(default_factory=dict)  # member -> (tier, order)
    taken: dict[str, int] = field(default_factory=dict)  # tier -> seats taken
    scores: dict[str, float] = field(default_factory=dict)  # member -> score (absent: none)

    def division_of(self, member: str, size: int) -> tuple[str, int] | None:
        seat = self.seats.get(member)
        return None if seat is None else (seat[0], seat[1] // size + 1)

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


@dataclass
class LeagueModel:
    rules: LeagueRules
    carried: Callable[[str, str], str | None] = lambda board, member: None  # a member's tier, if any
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
            if ev.op in ("delete", "erase"):
                s.scores.pop(ev.member, None)
                continue
            if ev.member not in s.seats:
                tier = self.carried(ev.board, ev.member)
                if tier not in self.rules.tiers:
                    tier = self.rules.entry_tier
                order = s.taken.get(tier, 0)
                s.taken[tier] = order + 1
                s.seats[ev.member] = (tier, order)
            old = s.scores.get(ev.member)
            if ev.op == "incr":
                s.scores[ev.member] = (old or 0.0) + ev.score
            elif ev.op == "set" or old is None or ((ev.score > old) if self.rules.desc else (ev.score < old)):
                s.scores[ev.member] = ev.score
