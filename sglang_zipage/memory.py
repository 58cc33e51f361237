"""Zipage's GPU memory: a share of what SGLang could give the KV pool, never on top of it.

Zipage keeps two buffers on the device beside SGLang's KV pool:
  global scores   [layers, pool slots + page, kv heads] fp32: a fixed cost per pool token,
                  like the KV itself (none with --zipage-decay 0)
  query window    [layers, slots + 1, W, query heads, query width]: the last W decode queries
                  of the requests near a compaction (query_window.py); a cost per window slot,
                  plus its table of each request row's slot (int64 per req_pool_idx); with
                  the calibrated scorer none, and its query statistics instead (a fixed cost)
SGLang profiles the memory it could give the pool (available_bytes) and sizes the pool from
it, capped by the user's --max-total-tokens. Zipage's share is taken from that memory, capped
pool or not: an uncapped pool shrinks by exactly what zipage keeps; a capped pool keeps its
tokens where the memory its cap left free holds zipage's bytes. Nothing is allocated outside
that memory.

Sizing rule (plain ints; ``plan``):
  M1  zipage's bytes <= share * the memory SGLang could give the pool (--zipage-memory-fraction
      of available_bytes, before --max-total-tokens)
  M2  window slots <= what can be in flight: SGLang's max_running_requests, and the requests the
      pool can hold past the point where they take a slot (pool / (limit - W) + 1); a capped
      pool takes no slots it cannot use
  M3  pool tokens + zipage's bytes / cell <= that memory: the pool shrinks only where the
      memory beside it cannot hold zipage's bytes
  M4  a plan that cannot hold the global scores and one window slot (the calibrated
      scorer: its statistics) is refused (``NoRoom``), naming the bytes and the flags that
      change them
  M5  a plan M4 refuses with all of the device's memory is refused with any less: the share
      minus the scores of the pool SGLang sizes from the memory (share * m - score bytes per
      token * min(cap, m / cell)) is convex in m, so on [0, device] it is largest at an end,
      and at m = 0 it is 0, too little for the table and a slot. ``plan_before_start``
      refuses such a plan before anything starts (up to a page's scores: SGLang rounds the
      pool down to whole pages)
A request that finds no free slot when it reaches its limit is compacted without a window
(the most recent tokens kept, ``windowless_compactions``): it never outgrows its limit.
Imports nothing from sglang or torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MIB = 1 << 20
SCORE_BYTES = 4  # global scores are fp32
SHARE_BASE = "SGLang could give the KV pool"  # M1's base, in the report and the messages


class NoRoom(RuntimeError):
    """The memory share cannot hold zipage's buffers; the message says what to change."""


@dataclass(frozen=True)
class BufferShapes:
    """What zipage keeps per pool slot and per window slot, read from the model (kv_layout)."""

    scored_layers: int  # layers whose tokens are scored (full attention)
    kv_heads: int  # global-score columns per layer (1 for MLA's latent row)
    query_heads: int  # query heads of this rank
    query_width: int  # elements of one stored query row (head_dim; MLA: nope + rope)
    query_bytes: int  # element size of stored queries (the model dtype)
    global_scores: bool = True  # False with --zipage-decay 0
    stats_queries: int = 0  # the calibrated scorer's queries per head (query_stats.py, in
    # the model dtype on the device); then no query window: no slots, no table

    @property
    def query_window(self) -> bool:
        return not self.stats_queries

    @property
    def stats_bytes(self) -> int:
        return (self.scored_layers * self.stats_queries * self.query_heads * self.query_width
                * self.query_bytes)

    def score_bytes(self, pool_tokens: int, page: int) -> int:
        if not self.global_scores:
            return 0
        return self.scored_layers * (pool_tokens + page) * self.kv_heads * SCORE_BYTES

    def slot_bytes(self, window: int) -> int:
        if not self.query_window:
            return 0
        return self.scored_layers * window * self.query_heads * self.query_width * self.query_bytes

    def launch_query_bytes(self, window: int) -> int:
        """The queries one request brings to a scoring launch: a copy of its window slot, or
        the calibrated scorer's rows rotated to its position (kernels.rotate_queries)."""
        return self.slot_bytes(window) if self.query_window else self.stats_bytes

    def window_bytes(self, slots: int, window: int) -> int:
        """The ring holds one dump row beside the slots (query_window.py)."""
        return (slots + 1) * self.slot_bytes(window) if slots else 0

    def table_bytes(self, max_running: int) -> int:
        """The slot of each req_pool_idx row (SGLang allocates max_running + 1), int64."""
        return 8 * (max_running + 1) if self.query_window else 0


@dataclass(frozen=True)
class MemoryPlan:
    pool_tokens: int  # zipage's KV pool
    stock_pool_tokens: int  # the pool SGLang sized (after --max-total-tokens)
    available_bytes: int  # what SGLang could give the pool: M1's base
    cell_bytes: int  # KV bytes per pool token
    window_slots: int
    slot_bytes: int
    score_bytes: int
    window_bytes: int
    table_bytes: int
    share: float
    slots_wanted: int  # M2's bound: what could be in flight
    stats_bytes: int = 0  # the calibrated scorer's queries (no window then)

    @property
    def zipage_bytes(self) -> int:
        return self.score_bytes + self.window_bytes + self.table_bytes + self.stats_bytes

    @property
    def kv_pool_bytes(self) -> int:
        return self.pool_tokens * self.cell_bytes

    @property
    def stock_kv_pool_bytes(self) -> int:
        return self.stock_pool_tokens * self.cell_bytes

    @property
    def taken_from_pool_bytes(self) -> int:
        """What the pool gave up (M3); the rest of zipage's bytes sit beside a capped pool."""
        return (self.stock_pool_tokens - self.pool_tokens) * self.cell_bytes

    def describe(self) -> dict:
        return {**asdict(self), "share_taken_from": SHARE_BASE,
                "zipage_bytes": self.zipage_bytes, "kv_pool_bytes": self.kv_pool_bytes,
                "stock_kv_pool_bytes": self.stock_kv_pool_bytes,
                "taken_from_pool_bytes": self.taken_from_pool_bytes,
                "share_of_available": round(self.zipage_bytes / max(1, self.available_bytes), 5)}

    def log_line(self) -> str:
        if self.pool_tokens == self.stock_pool_tokens:
            pool = (f"the KV pool keeps its {self.pool_tokens} tokens (the memory beside it "
                    f"holds zipage's bytes)")
        else:
            pool = (f"the KV pool gives {self.taken_from_pool_bytes / MIB:.1f} MiB "
                    f"({self.stock_pool_tokens} -> {self.pool_tokens} tokens)")
        return (f"zipage memory: {self.zipage_bytes / MIB:.1f} MiB, "
                f"{100 * self.zipage_bytes / max(1, self.available_bytes):.2f}% of the "
                f"{self.available_bytes / MIB:.1f} MiB {SHARE_BASE} (cap {100 * self.share:g}%, "
                f"--zipage-memory-fraction): global scores {self.score_bytes / MIB:.1f} MiB, "
                + (f"query window {self.window_slots} slots x {self.slot_bytes / MIB:.2f} MiB "
                   f"({self.slots_wanted} could be in flight)" if self.slot_bytes else
                   f"no query window (calibrated scorer: statistics "
                   f"{self.stats_bytes / MIB:.2f} MiB)") + f"; {pool}")


def slots_wanted(pool_tokens: int, max_running: int, limit: int, window: int) -> int:
    """M2: a request takes its slot W tokens before its limit, so holders each hold at least
    limit - W suffix tokens of the pool; never more than SGLang runs at once."""
    return max(1, min(max_running, pool_tokens // max(1, limit - window) + 1))


def plan(shapes: BufferShapes, *, stock_pool_tokens: int, cell_bytes: int, available_bytes: int,
         max_running: int, limit: int, window: int, page: int, share: float,
         model: str = "this model", base: str = SHARE_BASE) -> MemoryPlan:
    """Size zipage's buffers and the pool that remains (M1-M4).

    stock_pool_tokens: the pool SGLang sized (after --max-total-tokens); cell_bytes: its KV
    bytes per token; available_bytes: the memory it could give the pool, the share's base
    (M1) and the bound of pool and buffers together (M3). base: what available_bytes is, for
    NoRoom's message."""
    cap = int(share * available_bytes)
    slot = shapes.slot_bytes(window)
    scores = shapes.score_bytes(stock_pool_tokens, page)
    table = shapes.table_bytes(max_running)
    wanted = slots_wanted(stock_pool_tokens, max_running, limit, window) if slot else 0
    fixed = scores + table + shapes.stats_bytes
    if slot:
        fit = (cap - fixed) // slot - 1 if cap > fixed else -1  # the ring's dump row counts
    else:
        fit = 0 if cap >= fixed else -1
    if fit < 0 or (slot and fit < 1):
        raise NoRoom(_no_room(model, shapes, scores, table, slot, available_bytes, share,
                              window, stock_pool_tokens, base))
    slots = min(wanted, fit)
    total = fixed + shapes.window_bytes(slots, window)
    room = max(0, available_bytes - total) // cell_bytes  # M3
    pool = min(stock_pool_tokens, room) // page * page
    return MemoryPlan(pool_tokens=pool, stock_pool_tokens=stock_pool_tokens,
                      available_bytes=available_bytes, cell_bytes=cell_bytes,
                      window_slots=slots, slot_bytes=slot,
                      score_bytes=shapes.score_bytes(pool, page),
                      window_bytes=shapes.window_bytes(slots, window), table_bytes=table,
                      share=share, slots_wanted=wanted, stats_bytes=shapes.stats_bytes)


def plan_before_start(shapes: BufferShapes, *, cell_bytes: int, device_bytes: int,
                      max_total_tokens, limit: int, window: int, page: int, share: float,
                      model: str = "this model") -> MemoryPlan:
    """M5: the plan with all of the device's memory (device_bytes, more than SGLang can ever
    give the pool) and the pool SGLang would size from it, capped at --max-total-tokens
    (None: no cap), with the least slot table (one request: SGLang resolves its cap later).
    Raises NoRoom where no start on this device could fit zipage's buffers."""
    stock = device_bytes // cell_bytes
    if max_total_tokens:
        stock = min(stock, max_total_tokens)
    return plan(shapes, stock_pool_tokens=stock // page * page, cell_bytes=cell_bytes,
                available_bytes=device_bytes, max_running=1, limit=limit,
                window=window, page=page, share=share, model=model,
                base="this device has, more than SGLang can give the KV pool")


def share_needed(scores: int, slot: int, available_bytes: int) -> float:
    """The smallest --zipage-memory-fraction that holds the scores and one slot (M4)."""
    return (scores + 2 * slot) / max(1, available_bytes)


def _no_room(model, shapes, scores, table, slot, available, share, window, pool, base) -> str:
    need = share_needed(scores + table + shapes.stats_bytes, slot, available)
    ways = [f"raise --zipage-memory-fraction to {_round_up(need)} or more"]
    if slot:
        ways.append(f"lower --zipage-window (now {window})")
    if scores:
        ways.append(f"pass --zipage-decay 0 (drops the global scores, {scores / MIB:.1f} MiB)")
    if slot:
        what = (f"the slot table {table / MIB:.2f} MiB and one query-window slot "
                f"{slot / MIB:.2f} MiB ({shapes.scored_layers} layers x W {window} x "
                f"{shapes.query_heads} query heads x {shapes.query_width})")
    else:
        what = f"the calibrated scorer's query statistics {shapes.stats_bytes / MIB:.2f} MiB"
    return (f"sglang-zipage cannot fit its buffers for {model} in --zipage-memory-fraction "
            f"{share:g} ({share * available / MIB:.1f} MiB) of the {available / MIB:.1f} MiB "
            f"{base}: global scores take {scores / MIB:.1f} MiB ({pool} pool tokens), {what}; "
            + ", ".join(ways) + ", or --zipage-disable")


def score_share(kv_row_bytes: int) -> float:
    """Global scores as a share of a pool whose every layer is scored: one fp32 score per
    (layer, KV head) for a KV row of kv_row_bytes (K and V, or MLA's latent row). The
    launcher's check before any weight loads, where the user did not cap the pool: then the
    pool is all the memory M1 takes the share of, and this part of M4 needs no size."""
    return SCORE_BYTES / kv_row_bytes


def scores_exceed_share(model: str, share: float, needed: float) -> str:
    return (f"sglang-zipage cannot fit its buffers for {model}: its global scores alone take "
            f"{100 * needed:.2f}% of the KV pool (one fp32 score per KV row), more than "
            f"--zipage-memory-fraction {share:g}; raise --zipage-memory-fraction to "
            f"{_round_up(needed * 1.25)} or more, or pass --zipage-decay 0 (no global "
            f"scores), or --zipage-disable")


def _round_up(x: float) -> str:
    return f"{math.ceil(x * 1000) / 1000:g}"
