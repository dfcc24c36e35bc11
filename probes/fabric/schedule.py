"""Who meets whom, and when: a round-robin tournament (the circle method) over the sorted
member names, one round per slot.

Every node computes the schedule alone from the same inputs (the member names and the
wall clock), so there is no coordinator. ``slot = floor(unix_time / slot_seconds)``;
with n members (n even) the round is ``slot mod (n - 1)``; with n odd a bye is added
(n + 1 seats) and the round is ``slot mod n``. Over any n - 1 consecutive slots (n for odd
n) every member meets every other exactly once. The lower-ordered name of a pair hosts
the rendezvous.

Circle method: seat 0 stays fixed, seats 1..m-1 rotate by one each round; in round r the
rotating seats hold ``seats[1 + (i - r) mod (m - 1)]`` and seat i meets seat m - 1 - i.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BYE = None


@dataclass(frozen=True)
class Meeting:
    slot: int
    round: int
    me: str
    partner: str | None          # None: a bye (odd member count) or a fleet of one
    host: str | None             # the lower-ordered name of the pair; it listens

    @property
    def i_host(self) -> bool:
        return self.host == self.me


def slot_of(unix_time: float, slot_seconds: float) -> int:
    return math.floor(unix_time / slot_seconds)


def rounds(n: int) -> int:
    """Rounds in one full tournament of n members: n - 1 (n even), n (n odd; each has one bye)."""
    if n < 2:
        return 1
    return n - 1 if n % 2 == 0 else n


def pairs(names: list[str] | tuple[str, ...], round_index: int) -> list[tuple[str | None, str | None]]:
    """The pairs of one round, each (lower, higher) by name; a bye pairs a name with None."""
    seats: list[str | None] = sorted(set(names))
    if len(seats) < 2:
        return [(s, None) for s in seats]
    if len(seats) % 2:
        seats.append(BYE)
    m = len(seats)
    r = round_index % (m - 1)
    rot = [seats[0]] + [seats[1 + (i - 1 - r) % (m - 1)] for i in range(1, m)]
    out = []
    for i in range(m // 2):
        a, b = rot[i], rot[m - 1 - i]
        if a is None or b is None:
            out.append((a if a is not None else b, None))
        else:
            out.append((min(a, b), max(a, b)))
    return out


def partner_of(names: list[str] | tuple[str, ...], me: str, round_index: int) -> str | None:
    for a, b in pairs(names, round_index):
        if a == me:
            return b
        if b == me:
            return a
    raise KeyError(f"{me!r} is not a fabric member")


def meeting(names: list[str] | tuple[str, ...], me: str, unix_time: float, slot_seconds: float) -> Meeting:
    """This member's meeting in the slot holding ``unix_time``."""
    members = sorted(set(names))
    slot = slot_of(unix_time, slot_seconds)
    r = slot % rounds(len(members))
    partner = partner_of(members, me, r)
    host = None if partner is None else min(me, partner)
    return Meeting(slot, r, me, partner, host)
