"""Rounds: the orders in which a point's implementations are measured round after round, and the row that
stands for an implementation's rounds."""

from __future__ import annotations

import dataclasses
import random

from .schema import BUDGET_SPENT, Row


def round_orders(n: int, rounds: int) -> list[list[int]]:
    """The orders in which :meth:`Runner.run` measures a point's ``n`` implementations in each of ``rounds``
    rounds: as listed; reversed, but with the last one kept last (so that the second round does not begin
    with the implementation that ended the first: a state one measurement leaves can outlast the next one);
    the even positions then the odd ones; then seeded shuffles. For n >= 3 no two
    implementations adjacent in the first order are adjacent, in that order, in the second or third, nor
    across the rounds' boundaries, so an implementation does not keep the predecessor that may have sped it
    up or slowed it down. With n = 2 the second order is the reversed one and the third the first again."""
    base = list(range(n))
    second = base[-2::-1] + base[-1:] if n >= 3 else base[::-1]
    fixed = [base, second, base[0::2] + base[1::2]]
    orders = fixed[:rounds]
    for r in range(len(orders), rounds):
        order = base[:]
        random.Random(r).shuffle(order)
        orders.append(order)
    return orders


def median_row(rows: list[Row], varied: bool = True) -> Row:
    """One implementation's row of one mode from its rows of several rounds: the timed round with the
    median ``ms_p50`` (of an even count, the slower middle one: the effect the rounds are for speeds a call
    up), its note saying so; with no timed round, the first round's row (a skip or error row says the same
    in every round but for the budget). A round that failed where others were timed is named in the note;
    ``varied``: whether the rounds took the point's implementations in more than one order (the note says
    so)."""
    timed = sorted((r for r in rows if r.status == "ok" and r.ms_p50 is not None), key=lambda r: r.ms_p50)
    if not timed:
        return rows[0]
    mid = timed[len(timed) // 2]
    if len(rows) == 1:
        return mid
    if len(timed) == 1:
        said = f"timed in 1 of {len(rows)} rounds"
    else:
        lo, hi = timed[0].ms_p50, timed[-1].ms_p50
        orders = " in varied orders" if varied else ""
        said = f"median of {len(timed)} of {len(rows)} rounds{orders} (p50 {lo:.4g}-{hi:.4g} ms)"
    failed = [f"round {i + 1}: {r.status}: {r.note}" for i, r in enumerate(rows)
              if r.status != "ok" and r.note != BUDGET_SPENT]  # fmt: skip
    return dataclasses.replace(mid, note="; ".join(s for s in (said, *failed[:1], mid.note) if s))
