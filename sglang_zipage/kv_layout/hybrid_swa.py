"""SWAKVPool (gpt-oss): full-attention layers compress, the sliding-window pool follows."""

from __future__ import annotations

from typing import Dict

import torch

from sglang_zipage.kv_layout.base import (DISABLE_HINT, KVLayout, LayerKV, ZipageUnsupported,
                                          key_format, uniform_query, window_of)


class HybridSWALayout(KVLayout):
    """SWAKVPool: full-attention layers in ``full_kv_pool`` (indexed by the request's
    columns' slots), sliding-window layers in ``swa_kv_pool`` (indexed through
    ``full_to_swa_index_mapping``; slots outside the window are freed as decode goes on)."""

    name = "hybrid-swa"
    spans_anywhere = False  # remap_window moves the newest columns of the compressed span

    def __init__(self, pool, attns: Dict[int, list]):
        # layers the model has (a pool sized from a longer config may map more)
        mapping = {l: v for l, v in pool.layers_mapping.items() if l in attns}
        full = sorted(l for l, (_, is_swa) in mapping.items() if not is_swa)
        swa = sorted(l for l, (_, is_swa) in mapping.items() if is_swa)
        if not full:
            raise ZipageUnsupported(f"every attention layer has a sliding window: nothing "
                                    f"to compress; {DISABLE_HINT}")
        self.scored_layers = tuple(full)
        scored = [attns[l][0] for l in full]
        self.query = uniform_query(scored, "full-attention")
        self.sliding_window = max([window_of(attns[l][0]) for l in swa] or [0])
        self.least_kv_budget = max(1, self.sliding_window)
        fpool = pool.full_kv_pool
        key_dtype, scales = key_format(fpool, scored)
        rows = [pool.layers_mapping[l][0] for l in full]
        self.kv = LayerKV(keys=[fpool.k_buffer[i] for i in rows],
                          values=[fpool.v_buffer[i] for i in rows],
                          key_dtype=key_dtype, key_scales=scales)

    def remap_window(self, req_to_token, items, k: int, allocator, reqs) -> None:
        """Shift each request's live sliding-window tokens to the columns they occupy after
        the compaction: the newest n columns [c0 + S - n, c0 + S) become [c0 + k - n, c0 + k)
        (n = the window, page aligned, at most k). Their SWA slots move with them in
        ``full_to_swa_index_mapping``; every other SWA slot of the suffix is freed and its
        mapping cleared, so the full slots freed next carry no SWA slot; the request's
        ``swa_evicted_seqlen`` moves down to c0 + k - n."""
        mapping = allocator.full_to_swa_index_mapping
        page = allocator.page_size
        n = min(k, -(-self.sliding_window // page) * page)
        for it, req in zip(items, reqs):
            row = req_to_token[it.req_pool_idx]
            suffix_slots = row[it.c0:it.c0 + it.suffix].to(torch.int64)
            old = mapping[suffix_slots]
            moved = old[it.suffix - n:]  # the window's SWA slots, oldest first
            keep = torch.zeros_like(old, dtype=torch.bool)
            keep[it.suffix - n:] = moved > 0
            dropped = old[~keep]
            allocator.swa_attn_allocator.free(dropped[dropped > 0])
            mapping[suffix_slots] = 0
            mapping[suffix_slots[k - n:k]] = moved
            req.kv.swa_evicted_seqlen = it.c0 + k - n
