"""Repetition in a request's recent output: what the loop guard watches (plain ints).

Decode-time eviction can make a reasoning model lose track and repeat itself until
max_new_tokens, costing more decode than the compression saved. The loop guard watches the
output of every request that went through a compaction: every ``every`` tokens it measures
the share of the last ``window`` tokens' n-grams that occurred before within that window
(``repeated_share``: 0 for text that never repeats an n-gram, toward 1 for a loop). Past
``threshold`` the request's budget is doubled (up to ``max_boost`` times the budget), so it
keeps more of what it wrote; the next check waits a whole window, so one loop is one trigger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def repeated_share(tokens: Sequence[int], n: int) -> float:
    """Share of the n-grams of ``tokens`` that occurred earlier in ``tokens`` (0 if none)."""
    tokens = list(tokens)
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    distinct = len(set(zip(*(tokens[i:] for i in range(n)))))  # the n-grams, built in C
    return (total - distinct) / total  # all but each n-gram's first occurrence


@dataclass(frozen=True)
class LoopGuard:
    window: int = 400  # tokens watched
    n: int = 8  # n-gram length
    threshold: float = 0.5  # repeated share that counts as a loop
    every: int = 32  # tokens between checks
    max_boost: int = 4  # the budget grows to at most this many times its own

    def due(self, generated: int, checked_at: int) -> bool:
        """A check is due: ``every`` tokens since the last one, and a full window written."""
        return generated >= self.window and generated - checked_at >= self.every

    def looping(self, output_ids: Sequence[int]) -> bool:
        return repeated_share(output_ids[-self.window:], self.n) > self.threshold

    def watch(self, state, output_ids: Sequence[int]) -> bool:
        """Check a compacted request when due (``state``: its request_state.ReqState); True
        when it loops and its budget multiplier was doubled (capped). After a check the next
        waits ``every`` tokens, after a trigger a whole window."""
        generated = len(output_ids)
        if not self.due(generated, state.loop_checked_at):
            return False
        state.loop_checked(generated)
        if state.loop_boost >= self.max_boost or not self.looping(output_ids):
            return False
        state.loop_raised(min(self.max_boost, 2 * state.loop_boost),
                          generated + self.window - self.every)
        return True
