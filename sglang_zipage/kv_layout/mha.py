"""MHATokenToKVPool, with or without sliding-window layers in the same pool."""

from __future__ import annotations

from typing import Dict

from sglang_zipage.kv_layout.base import (DISABLE_HINT, KVLayout, LayerKV, ZipageUnsupported,
                                          key_format, uniform_query, window_of)


class MHALayout(KVLayout):
    name = "mha"

    def __init__(self, pool, attns: Dict[int, list]):
        layers = sorted(attns)
        if len(layers) != len(pool.k_buffer):
            raise ZipageUnsupported(f"{len(layers)} attention layers for {len(pool.k_buffer)} "
                                    f"KV layers (layers without KV?); {DISABLE_HINT}")
        one = {l: attns[l][0] for l in layers}
        windows = {l: window_of(one[l]) for l in layers}
        self.scored_layers = tuple(l for l in layers if not windows[l])
        recent = [l for l in layers if windows[l]]
        if not self.scored_layers:
            raise ZipageUnsupported(f"every attention layer has a sliding window: nothing "
                                    f"to compress; {DISABLE_HINT}")
        scored = [one[l] for l in self.scored_layers]
        self.query = uniform_query(scored, "full-attention")
        self.sliding_window = max(windows.values())
        self.least_kv_budget = self.sliding_window or 1
        key_dtype, scales = key_format(pool, scored)
        idx = lambda l: l - getattr(pool, "start_layer", 0)
        self.kv = LayerKV(
            keys=[pool.k_buffer[idx(l)] for l in self.scored_layers],
            values=[pool.v_buffer[idx(l)] for l in self.scored_layers],
            key_dtype=key_dtype, key_scales=scales,
            recent_keys=[pool.k_buffer[idx(l)] for l in recent],
            recent_values=[pool.v_buffer[idx(l)] for l in recent])
        if recent:
            self.name = "mha+sliding-window"
