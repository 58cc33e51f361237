"""The backend switch: every op goes to its Triton kernel or to its torch twin.

SGLANG_ZIPAGE_KERNELS = "triton" | "ref", read at every call. Unset: "triton" for CUDA
tensors, "ref" for CPU tensors. "triton" on CPU needs TRITON_INTERPRET=1 set before the
first launch. The package (``sglang_zipage.kernels``) re-exports everything here.
"""

from __future__ import annotations

import os

import torch

from sglang_zipage.kernels import reference
from sglang_zipage.kernels.reference import (
    Rope,
    compact_kv_ref,
    global_scores_ref,
    protect_ref,
    select_topk,
    window_attention_scores_ref,
)

ENV_BACKEND = "SGLANG_ZIPAGE_KERNELS"

__all__ = [
    "ENV_BACKEND",
    "Rope",
    "backend_for",
    "compact_kv",
    "compact_kv_ref",
    "global_scores",
    "global_scores_ref",
    "protect_ref",
    "select_topk",
    "window_attention_scores",
    "window_attention_scores_ref",
]


def backend_for(device: torch.device) -> str:
    """'triton' or 'ref': the env switch, else by device type."""
    choice = os.environ.get(ENV_BACKEND, "").strip().lower()
    if choice in ("triton", "ref"):
        return choice
    if choice:
        raise ValueError(f"{ENV_BACKEND}={choice!r}: expected 'triton' or 'ref'")
    return "triton" if device.type == "cuda" else "ref"


def window_attention_scores(q_window, k_buffers, src_slots, src_lens, sm_scale,
                            key_dtype=None, key_scales=None, rope=None):
    """See reference.window_attention_scores_ref for the contract."""
    args = (q_window, k_buffers, src_slots, src_lens, sm_scale, key_dtype, key_scales, rope)
    if backend_for(q_window.device) == "ref":
        return window_attention_scores_ref(*args)
    from sglang_zipage.kernels.scores import window_attention_scores as op

    return op(*args)


def global_scores(attention, score_buffers, src_slots, src_lens, n_stored, first, pooling,
                  decay, sink, window):
    """See reference.global_scores_ref for the contract."""
    args = (attention, score_buffers, src_slots, src_lens, n_stored, first, pooling, decay,
            sink, window)
    if backend_for(attention.device) == "ref":
        return global_scores_ref(*args)
    from sglang_zipage.kernels.pool_decay_protect import global_scores as op

    return op(*args)


def compact_kv(k_buffers, v_buffers, score_buffers, src_slots, keep, dst_slots, kept_scores):
    """See reference.compact_kv_ref for the contract."""
    if backend_for(keep.device) == "ref":
        return compact_kv_ref(k_buffers, v_buffers, score_buffers, src_slots, keep, dst_slots, kept_scores)
    from sglang_zipage.kernels.compaction import compact_kv as op

    return op(k_buffers, v_buffers, score_buffers, src_slots, keep, dst_slots, kept_scores)


window_attention_scores.__doc__ = reference.window_attention_scores_ref.__doc__
compact_kv.__doc__ = reference.compact_kv_ref.__doc__
global_scores.__doc__ = reference.global_scores_ref.__doc__
