"""Elastic mode's room on demand: which running requests give tokens back, and how many.

Two occasions, both under pressure (budget.Pressure): a decode step that would not get its
pages, and the first waiting request that does not fit beside what the running requests are
booked for (planner.Planner.make_room is the caller of both). Requests give back in budget.py's
A2 order: past their limit, then over their budget (down to it), largest first; only if that
is not enough, with a budget range, the largest are squeezed to their floor and keep it as
their budget until the pressure ends (A3); at a decode step (where SGLang would retract next)
so are requests whose budget the loop guard raised, down to the floor of their own budget,
range or not. What is still short is SGLang's to retract.

Plain Python over ints: what each request can give (``offer``) and the choice (``choose``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from sglang_zipage.budget import Budget


@dataclass(frozen=True)
class Offer:
    """What one running request can give back now (A2)."""

    row: int
    back: Optional[Tuple[int, int]]  # (tokens freed, kept) down to its budget
    squeeze: Optional[Tuple[int, int]]  # (tokens freed, kept) down to its floor
    past: bool  # past its limit: it gives the most
    filling: bool  # its window still fills: compacted without it (windowless)


@dataclass(frozen=True)
class Choice:
    row: int
    kept: int
    squeezed: bool  # down to its floor, which is its budget until the pressure ends (A3)
    early: bool  # down to its budget before its limit (neither past it nor squeezed)
    windowless: bool


def offer(row: int, suffix: int, budget: Budget, floor: int, filling: bool,
          early: bool) -> Optional[Offer]:
    """What the request in ``row`` can give: with ``early`` (a decode step, where SGLang
    would retract next) whatever is over its budget, windowless if its window still fills;
    else (before admission) only what is past its limit, and never without its window."""
    if filling and not early:
        return None
    kept = budget.give_back(suffix)
    back = (suffix - kept, kept) if kept is not None and (early or suffix >= budget.limit) else None
    kept = budget.squeeze_to(suffix, floor)
    squeeze = (suffix - kept, kept) if kept is not None else None
    if back is None and squeeze is None:
        return None
    return Offer(row, back, squeeze, back is not None and suffix >= budget.limit, filling)


def choose(offers: Sequence[Offer], tokens: int, headroom: int = 0) -> Tuple[List[Choice], int]:
    """Requests to compact until ``tokens`` slots are freed or none can give more (A2):
    those over their budget, largest first (those past their limit up to ``headroom`` more,
    so the next steps do not run short again); then the squeeze, the largest extra first.
    Returns (the choices in row order, the slots they free)."""
    kept, freed = {}, 0
    for o in sorted((o for o in offers if o.back), key=lambda o: -o.back[0]):
        if freed >= tokens + (headroom if o.past else 0):
            continue
        kept[o.row], freed = o.back[1], freed + o.back[0]
    squeezed = set()
    if freed < tokens:  # every request gave back down to its budget, and not enough
        extra = {o.row: o.squeeze[0] - (o.back[0] if o.back else 0) for o in offers if o.squeeze}
        by_row = {o.row: o for o in offers}
        for row in sorted(extra, key=lambda r: -extra[r]):
            if freed >= tokens:
                break
            kept[row], freed = by_row[row].squeeze[1], freed + extra[row]
            squeezed.add(row)
    by_row = {o.row: o for o in offers}
    return [Choice(row, kept[row], row in squeezed,
                   early=row not in squeezed and not by_row[row].past,
                   windowless=by_row[row].filling) for row in sorted(kept)], freed
