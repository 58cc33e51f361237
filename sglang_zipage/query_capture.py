"""The scheduler's side of a calibration run (calibrate.py): every prefill's queries of the
scored layers, turned back into pre-RoPE queries, summed into a query_stats.Accumulator and
saved once the run's tokens have all gone through, one file per tensor-parallel rank (each
holds its slice of the query heads); calibrate.py joins them.

A run is asked for through the environment (ENV = "PREFIX|TOKENS", set by calibrate.py before
the Engine starts its schedulers), so a server never captures anything. The queries are what
the layout stores of a query (``KVLayout.prefill_queries``: MLA's q_nope | q_rope, 192 wide for
DeepSeek V3, taken from the prefill's MHA form or the absorbed path), at the batch's positions
undone with the model's own RoPE table (a YaRN mscale included).
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from sglang_zipage import kv_layout
from sglang_zipage.kernels.reference import rotate
from sglang_zipage.query_stats import Accumulator

ENV = "SGLANG_ZIPAGE_CALIBRATE"


def requested() -> Optional[Tuple[str, int]]:
    """(file prefix, tokens) of the calibration run this process belongs to, or None."""
    value = os.environ.get(ENV)
    if not value:
        return None
    prefix, tokens = value.rsplit("|", 1)
    return prefix, int(tokens)


def rank_file(prefix: str, rank: int) -> str:
    return f"{prefix}.rank{rank}.pt"


class QueryCapture:
    def __init__(self, layout, model, prefix: str, tokens: int, rank: int):
        if layout.rope_start is None:
            raise kv_layout.ZipageUnsupported(
                f"the {layout.name} layout stores absorbed queries: the calibrated scorer "
                f"needs pre-absorption ones; use --zipage-scorer window")
        self.layout, self.prefix, self.tokens, self.rank = layout, prefix, tokens, rank
        self.cos_sin, self.neox = kv_layout.rope_of(model, layout.scored_layers)
        self.acc = Accumulator(self.neox, layout.rope_start)
        self.scored, self.last = set(layout.scored_layers), max(layout.scored_layers)
        self.saved = False

    def add(self, attn, q: torch.Tensor, q_rope, forward_batch) -> None:
        """A prefill's queries of one layer (RadixAttention's arguments)."""
        layer = attn.layer_id
        if self.saved or layer not in self.scored:
            return
        rows = self.layout.prefill_queries(attn, q, q_rope)  # [T, Hq, width], post-RoPE
        table = self.cos_sin[forward_batch.positions].float()
        half = table.shape[-1] // 2
        pre = rotate(rows, table[:, None, :half], table[:, None, half:], self.neox,
                     self.layout.rope_start, inverse=True)
        self.acc.add(layer, pre, 2 * half)
        if layer == self.last and self.acc.counts[layer] >= self.tokens:
            torch.save(self.acc.state(), rank_file(self.prefix, self.rank))
            self.saved = True
