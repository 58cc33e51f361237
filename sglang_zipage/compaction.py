"""Compaction plans: made on the CPU from scheduler state; executor.py runs them.

A plan is made in the scheduler from CPU state only (identical on every TP rank). For
each request it snapshots the slots of its compressible suffix, columns [c0, c0 + S),
and names the destination: the suffix's own leading k columns, [c0, c0 + k). So the
columns keep their slots; only the data inside them moves (slot j of head h receives
head h's j-th kept token) and the slots of columns [c0 + k, c0 + S) are freed.

Invariants (see budget.py for I1-I6):
  I2  c0 and k are page aligned, so every freed column range is whole pages
  I3  nothing below c0 is read as a destination or freed
  C1  executing a plan never reads req_to_token: the source slots are its snapshot
  C2  a plan executes on the stream of the next forward, before it: after the previous
      forward (which may still write the last suffix token and the last query) and
      before any forward that writes into the freed slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from sglang_zipage.budget import check_i2

# A plan's S_max (its longest suffix) is rounded up to this many columns: Triton compiles a
# kernel variant per divisibility class of its integer arguments, so suffixes of any length
# (elastic mode compacts whatever a request grew to) share the variant the warm-up compiled.
S_MAX_ALIGN = 16


def aligned_s_max(longest: int) -> int:
    """S_max of a plan whose longest suffix is ``longest``: the next S_MAX_ALIGN multiple."""
    return -(-longest // S_MAX_ALIGN) * S_MAX_ALIGN


@dataclass(frozen=True)
class CompactionItem:
    """One request to compress, from the scheduler's CPU state."""

    req_pool_idx: int
    c0: int  # first compressible column
    suffix: int  # S: compressible columns [c0, c0 + S)
    n_stored: int  # leading suffix tokens with a valid stored global score
    first: bool  # first compaction of this request (pooling applies)
    window_slot: int  # its row in the query window; 0: none
    kv_budget: int  # k: tokens it keeps per (layer, KV head)
    tail: int = 0  # columns after the compressed span, [c0 + S, c0 + S + tail): its answer,
    # never evicted; they move right behind the kept tokens (``shift_tail``)
    windowless: bool = False  # scored by the window but holds no slot: the most recent
    # tokens are kept (budget W2)
    position: int = 0  # its next logical position: where the calibrated scorer's queries sit


@dataclass(frozen=True)
class CompactionPlan:
    k: int  # tokens kept per (layer, request, KV head)
    req_pool_indices: List[int]
    window_slots: torch.Tensor  # [R] int64
    src_slots: torch.Tensor  # [R, S_max] int64 snapshot, padding 0 (S_max: S_MAX_ALIGN multiple)
    src_lens: torch.Tensor  # [R] int64
    dst_slots: torch.Tensor  # [R, k] int64 == src_slots[:, :k] (in place)
    n_stored: torch.Tensor  # [R] int64
    first: torch.Tensor  # [R] bool
    windowless: bool = False  # no request has a window: the most recent tokens are kept
    positions: Optional[torch.Tensor] = None  # [R] int64 next logical positions (CPU)

    @property
    def tensors(self):
        return (self.window_slots, self.src_slots, self.src_lens, self.dst_slots,
                self.n_stored, self.first)


def plan_compaction(req_to_token: torch.Tensor, items: Sequence[CompactionItem], k: int,
                    page_size: int, fresh: Optional[torch.Tensor] = None):
    """Return (plan, slots to free). Runs on the scheduler's stream.

    In place (fresh None): the surplus columns' slots, free now (C2 orders the reuse).
    Shadow (fresh [R, k] slots): the whole snapshot [R, S_max] padded with 0, to free only
    at commit (``src_lens`` says how many of each row are real)."""
    dev = req_to_token.device
    windowless = items[0].windowless
    assert all(it.windowless == windowless for it in items), "one launch, one kind"
    s_max = aligned_s_max(max(it.suffix for it in items))
    rows, cols, free_rows, free_cols = [], [], [], []
    for it in items:
        check_i2(it.c0, k, page_size)
        assert it.suffix > k, "a compaction must evict something"
        span = torch.arange(s_max).clamp_(max=it.suffix - 1) + it.c0
        rows.append(torch.full((s_max,), it.req_pool_idx, dtype=torch.int64))
        cols.append(span)
        free_rows.append(torch.full((it.suffix - k,), it.req_pool_idx, dtype=torch.int64))
        free_cols.append(torch.arange(it.c0 + k, it.c0 + it.suffix))
    src = req_to_token[torch.stack(rows).to(dev), torch.stack(cols).to(dev)].to(torch.int64)
    lens_cpu = torch.tensor([it.suffix for it in items], dtype=torch.int64)
    pad = torch.arange(s_max)[None, :] >= lens_cpu[:, None]
    src.masked_fill_(pad.to(dev), 0)
    if fresh is None:
        to_free = req_to_token[torch.cat(free_rows).to(dev), torch.cat(free_cols).to(dev)].to(torch.int64)
        dst = src[:, :k].clone()
    else:
        assert fresh.shape == (len(items), k)
        to_free, dst = src, fresh.to(dev, torch.int64)
    plan = CompactionPlan(
        k=k,
        req_pool_indices=[it.req_pool_idx for it in items],
        window_slots=torch.tensor([it.window_slot for it in items], dtype=torch.int64).to(dev),
        src_slots=src,
        src_lens=lens_cpu.to(dev),
        dst_slots=dst,
        n_stored=torch.tensor([it.n_stored for it in items], dtype=torch.int64).to(dev),
        first=torch.tensor([it.first for it in items], dtype=torch.bool).to(dev),
        windowless=windowless,
        positions=torch.tensor([it.position for it in items], dtype=torch.int64),
    )
    return plan, to_free


def shift_tail(req_to_token: torch.Tensor, it: CompactionItem) -> None:
    """After a plan over [c0, c0 + S): point columns [c0 + k, c0 + k + tail) at the tail's
    slots, columns [c0 + S, c0 + S + tail). Only the table moves, not the KV; S and k are page
    aligned, so every tail token keeps its offset inside its page (I1). On the scheduler's
    stream, after the plan's snapshot (its freed slots were read before)."""
    if it.tail:
        row, k, s = req_to_token[it.req_pool_idx], it.c0 + it.kv_budget, it.c0 + it.suffix
        row[k:k + it.tail] = row[s:s + it.tail].clone()


def commit_shadow(req_to_token: torch.Tensor, req_pool_idx: int, c0: int, snapshot: int,
                  suffix: int, fresh: torch.Tensor) -> None:
    """Point columns [c0, c0 + k) at the compacted fresh slots and move the tail decoded
    since the snapshot, columns [c0 + snapshot, c0 + suffix), right behind them.

    Page alignment (I1) holds: c0, k and snapshot are page aligned, so every tail token
    keeps its offset inside its page. Device ops on the scheduler's stream (hazard (a) of
    the design map: forwards read a snapshot of req_to_token taken before they run)."""
    k, tail = fresh.numel(), suffix - snapshot
    row = req_to_token[req_pool_idx]
    if tail:
        row[c0 + k:c0 + k + tail] = row[c0 + snapshot:c0 + suffix].clone()
    row[c0:c0 + k] = fresh.to(row.dtype)
