"""global_scores (Triton) against its torch twin: max, one multiply and masks, so the
results must be bit-exact.

Rows longer than one kernel block (pooling windows that straddle two blocks), padding,
requests on their first compaction beside later ones, stored scores read through
permuted slots up to n_stored (0, inside and past the length), decay off, no score
buffers, and sink/window protection at both ends.
Run: .venv/bin/python -m pytest tests/kernels/test_global_scores.py
"""

import pytest
import torch

from kv_cases import device, make_pool
from sglang_zipage.kernels import global_scores_ref
from sglang_zipage.kernels import global_scores as dispatched
from sglang_zipage.kernels.pool_decay_protect import BLOCK_S, global_scores

LENS = [BLOCK_S + 37, 5, BLOCK_S, 130]


def window_scores(pool, n_layers, hkv, seed=1):
    """Random non-negative scores, 0 at padding (what window_attention_scores returns)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(n_layers, len(LENS), hkv, pool.src_slots.shape[1], generator=gen).to(device())
    pos = torch.arange(a.shape[-1], device=device())
    return a.masked_fill(~(pos[None, :] < pool.src_lens[:, None])[None, :, None, :], 0.0)


@pytest.mark.parametrize("pooling,decay,with_buffers,sink,window", [
    (5, 0.8, True, 0, 16),    # the engine's defaults
    (3, 0.5, True, 2, 4),
    (1, 0.8, True, 0, 0),     # no pooling, nothing protected
    (5, 0.0, True, 1, 3),     # decay off: stored scores ignored
    (7, 0.8, False, 0, 16),   # no score buffers
])
def test_kernel_equals_twin_bit_for_bit(pooling, decay, with_buffers, sink, window):
    n_layers, hkv = 2, 2
    pool = make_pool(LENS, n_layers=n_layers, hkv=hkv, page_size=4)
    a = window_scores(pool, n_layers, hkv)
    n_stored = torch.tensor([200, 0, BLOCK_S + 9, 64], device=device())
    first = torch.tensor([True, False, True, False], device=device())
    args = (a, pool.scores if with_buffers else None, pool.src_slots, pool.src_lens, n_stored,
            first, pooling, decay, sink, window)
    final, g = global_scores(*args)
    final_ref, g_ref = global_scores_ref(*args)
    assert torch.equal(g, g_ref)
    assert torch.equal(final, final_ref)
    assert torch.isinf(final).any()  # protection and padding are in the compared rows


def test_dispatch_sends_the_interpreter_run_to_the_kernel(monkeypatch):
    """SGLANG_ZIPAGE_KERNELS=triton reaches this op (and gives the twin's numbers)."""
    pool = make_pool(LENS, n_layers=1, hkv=1)
    a = window_scores(pool, 1, 1)
    args = (a, pool.scores, pool.src_slots, pool.src_lens, pool.src_lens, torch.ones(
        len(LENS), dtype=torch.bool, device=device()), 5, 0.8, 0, 16)
    calls = []
    import sglang_zipage.kernels.pool_decay_protect as mod
    monkeypatch.setattr(mod, "global_scores", lambda *x: calls.append(1) or global_scores(*x))
    monkeypatch.setenv("SGLANG_ZIPAGE_KERNELS", "triton")
    out = dispatched(*args)
    assert calls and all(torch.equal(x, y) for x, y in zip(out, global_scores_ref(*args)))


def test_bad_inputs_are_named():
    pool = make_pool(LENS, n_layers=1, hkv=1)
    a = window_scores(pool, 1, 1)
    first = torch.ones(len(LENS), dtype=torch.bool, device=device())
    with pytest.raises(ValueError, match="pooling"):
        global_scores(a, None, pool.src_slots, pool.src_lens, pool.src_lens, first, 4, 0.8, 0, 16)
    with pytest.raises(ValueError, match="first"):
        global_scores(a, None, pool.src_slots, pool.src_lens, pool.src_lens, first.int(), 5, 0.8, 0, 16)
    with pytest.raises(ValueError, match="attention"):
        global_scores(a.half(), None, pool.src_slots, pool.src_lens, pool.src_lens, first, 5, 0.8, 0, 16)
