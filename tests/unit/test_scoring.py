"""Selection pipeline (sglang_zipage.scoring) stage by stage, on CPU.

Each stage is checked against a brute-force loop written from the module
docstring's definition: pooling (first compaction only, valid tokens only),
global-score decay (stored scores read through the slots, garbage past
n_stored ignored), full and lightning redundancy (pairwise cosine matrices),
protection (sink, recent window, padding), select_topk, and select_and_compact
(kept K/V rows and stored global scores). The last test runs the Triton kernels
(interpreted without a GPU) against the torch twins through the backend switch.
Run: PYTHONPATH=. .venv/bin/python -m pytest tests/unit/test_scoring.py -q
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # before the first Triton launch (kernels jit lazily)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang_zipage.kernels import ENV_BACKEND, select_topk, window_attention_scores_ref  # noqa: E402
from sglang_zipage.kv_layout import LayerKV  # noqa: E402
from sglang_zipage.scoring import (Queries, ScoringParams, in_place_order, score_tokens,  # noqa: E402
                                   select_and_compact)

# The interpreter calls a NumPy API deprecated in 1.25 on every launch.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:triton.runtime.interpreter")
OFF = dict(decay=0.0, pooling=1, window=0, sink=0)
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def torch_twins(monkeypatch):
    """Stage tests compare exactly with the twins, so they run on them (GPU too)."""
    monkeypatch.setenv(ENV_BACKEND, "ref")


def make_inputs(lens, n_layers=2, hkv=2, g=2, d=16, w=4, seed=0):
    """Pool of permuted slots, queries, score buffers full of NaN garbage."""
    gen = torch.Generator().manual_seed(seed)
    s_max, n_req = max(lens), len(lens)
    n_slots = 1 + n_req * s_max + 5
    perm = torch.randperm(n_slots - 1, generator=gen) + 1
    src = torch.zeros(n_req, s_max, dtype=torch.int64)
    for r, n in enumerate(lens):
        src[r, :n] = perm[r * s_max : r * s_max + n]
    k = [torch.randn(n_slots, hkv, d, generator=gen) for _ in range(n_layers)]
    v = [torch.randn(n_slots, hkv, d, generator=gen) for _ in range(n_layers)]
    q = torch.randn(n_layers, n_req, w, hkv * g, d, generator=gen) * 2
    sb = [torch.full((n_slots, hkv), float("nan")) for _ in range(n_layers)]
    to = lambda xs: [x.to(DEV) for x in xs]  # noqa: E731
    return dict(q=q.to(DEV), k=to(k), v=to(v), sb=to(sb), src=src.to(DEV),
                lens=torch.tensor(lens, device=DEV), scale=d**-0.5)


def run(params, x, n_stored=None, first=None, score_buffers="sb"):
    n_req = x["src"].shape[0]
    n_stored = torch.zeros(n_req, dtype=torch.int64, device=DEV) if n_stored is None else n_stored
    first = torch.zeros(n_req, dtype=torch.bool, device=DEV) if first is None else first
    sb = x[score_buffers] if score_buffers else None
    return score_tokens(params, Queries(x["q"]), LayerKV(x["k"], x["v"]), sb, x["src"], x["lens"], n_stored, first, x["scale"])


def attention(x):
    return window_attention_scores_ref(x["q"], x["k"], x["src"], x["lens"], x["scale"])


def test_params_defaults_and_validation():
    p = ScoringParams()
    assert (p.window, p.decay, p.redundancy, p.redundancy_lambda, p.redundancy_tau, p.pooling, p.sink) == (
        16, 0.8, "none", 0.2, 0.4, 5, 0)
    for bad in (dict(redundancy="redudancy"), dict(pooling=4), dict(pooling=0), dict(redundancy_tau=0.0)):
        with pytest.raises(ValueError):
            ScoringParams(**bad)


def test_with_every_stage_off_final_is_attention():
    x = make_inputs([5, 12, 9])
    final, g = run(ScoringParams(**OFF), x)
    a = attention(x)
    assert torch.equal(g, a)
    for r, n in enumerate([5, 12, 9]):
        assert torch.equal(final[:, r, :, :n], a[:, r, :, :n])
        assert torch.all(final[:, r, :, n:] == float("-inf"))


def test_protect_sink_window_and_padding():
    lens = [12, 20, 5]
    x = make_inputs(lens)
    final, _ = run(ScoringParams(**{**OFF, "sink": 2, "window": 4}), x)
    for r, n in enumerate(lens):
        protected = set(range(min(2, n))) | set(range(max(0, n - 4), n))
        for s in range(max(lens)):
            row = final[:, r, :, s]
            if s >= n:
                assert torch.all(row == float("-inf"))
            elif s in protected:
                assert torch.all(row == float("inf"))
            else:
                assert torch.all(torch.isfinite(row))


def test_pooling_only_on_first_compaction_and_only_over_valid_tokens():
    lens = [9, 14, 3]
    x = make_inputs(lens)
    first = torch.tensor([True, False, True], device=DEV)
    final, g = run(ScoringParams(**{**OFF, "pooling": 5}), x, first=first)
    a = attention(x)
    for r, n in enumerate(lens):
        for s in range(n):
            window = a[:, r, :, max(0, s - 2) : min(n, s + 3)]
            want = window.amax(-1) if first[r] else a[:, r, :, s]
            assert torch.equal(g[:, r, :, s], want)
        assert torch.all(g[:, r, :, n:] == 0)


def test_decay_reads_stored_scores_through_slots_and_ignores_new_tokens():
    lens = [10, 7]
    x = make_inputs(lens)
    n_stored = torch.tensor([6, 0], device=DEV)
    stored = torch.rand(2, 2, 2, 10, generator=torch.Generator().manual_seed(1)).to(DEV)  # [L, R, H, S]
    for l in range(2):
        for r in range(2):
            slots = x["src"][r, : n_stored[r]]
            x["sb"][l][slots] = stored[l, r, :, : n_stored[r]].T
    _, g = run(ScoringParams(**{**OFF, "decay": 0.8}), x, n_stored=n_stored)
    a = attention(x)
    assert torch.equal(g[:, 0, :, :6], torch.maximum(a[:, 0, :, :6], 0.8 * stored[:, 0, :, :6]))
    assert torch.equal(g[:, 0, :, 6:], a[:, 0, :, 6:])  # NaN garbage past n_stored ignored
    assert torch.equal(g[:, 1], a[:, 1])
    _, g_off = run(ScoringParams(**OFF), x, n_stored=n_stored)
    assert torch.equal(g_off, a)


def brute_redundancy(x, lens, block, tau):
    """[L, R, H, S]: softmax over valid s of mean cosine to other valid keys (same block)."""
    n_layers, (n_req, s_max), hkv = len(x["k"]), x["src"].shape, x["k"][0].shape[1]
    out = torch.zeros(n_layers, n_req, hkv, s_max, device=DEV)
    for l in range(n_layers):
        for r, n in enumerate(lens):
            for h in range(hkv):
                e = torch.nn.functional.normalize(x["k"][l][x["src"][r, :n], h], dim=-1)
                sim = e @ e.T
                blk = torch.arange(n, device=DEV) // (block or s_max)
                pair = (blk[:, None] == blk[None, :]) & ~torch.eye(n, dtype=torch.bool, device=DEV)
                mean = (sim * pair).sum(1) / pair.sum(1).clamp(min=1)
                out[l, r, h, :n] = torch.softmax(mean / tau, dim=0)
    return out


@pytest.mark.parametrize("mode,block", [("full", None), ("lightning", 4)])
def test_redundancy_matches_pairwise_definition(mode, block):
    lens = [11, 6, 9]
    x = make_inputs(lens)
    params = ScoringParams(**{**OFF, "redundancy": mode, "lightning_block": block or 64})
    final, g = run(params, x)
    want = 0.2 * g - 0.8 * brute_redundancy(x, lens, block, 0.4)
    for r, n in enumerate(lens):
        torch.testing.assert_close(final[:, r, :, :n], want[:, r, :, :n], atol=1e-6, rtol=1e-5)


def test_select_topk_keeps_protected_drops_padding_and_sorts():
    scores = torch.tensor([[[[0.3, float("inf"), 0.1, 0.9, 0.2, float("-inf")]]]])
    keep = select_topk(scores, 3)
    assert keep.tolist() == [[[[0, 1, 3]]]] and keep.dtype == torch.int64
    rand = torch.rand(2, 3, 4, 50)
    keep = select_topk(rand, 20)
    assert torch.all(keep[..., 1:] > keep[..., :-1])
    assert torch.equal(rand.gather(-1, keep).sort(-1).values, rand.topk(20, -1).values.sort(-1).values)
    with pytest.raises(ValueError):
        select_topk(rand, 51)


def test_select_and_compact_moves_rows_and_stores_global_score():
    lens = [12, 10]
    x = make_inputs(lens)
    old_k = [t.clone() for t in x["k"]]
    for buf in x["sb"]:
        buf.zero_()
    params = ScoringParams(window=2, decay=0.8, pooling=3)
    n_stored = torch.zeros(2, dtype=torch.int64, device=DEV)
    first = torch.ones(2, dtype=torch.bool, device=DEV)
    final, g = run(params, x, n_stored=n_stored, first=first)
    dst = x["src"][:, :8].clone()
    keep = select_and_compact(params, Queries(x["q"]), LayerKV(x["k"], x["v"]), x["sb"], x["src"], x["lens"],
                              n_stored, first, x["scale"], dst, 8)
    assert torch.equal(keep, in_place_order(select_topk(final, 8), params.window))
    for l in range(2):
        for r, n in enumerate(lens):
            for h in range(2):
                assert set(range(n - 2, n)) <= set(keep[l, r, h].tolist())  # window kept
                assert torch.equal(x["k"][l][dst[r], h], old_k[l][x["src"][r, keep[l, r, h]], h])
                assert torch.equal(x["sb"][l][dst[r], h], g[l, r, h, keep[l, r, h]])


@pytest.mark.parametrize("redundancy,selection,ordered", [
    ("none", "score", False), ("full", "score", False), ("lightning", "score", True),
    ("none", "recent", True)])
def test_compaction_keeps_position_order_only_where_positions_mean_something(
        redundancy, selection, ordered):
    """Lightning blocks neighbouring positions and the recent control ranks by position: a
    later compaction of theirs reads meaning from the order, so theirs stays ascending."""
    lens = [40, 36]
    x = make_inputs(lens)
    params = ScoringParams(window=2, decay=0.0, pooling=1, redundancy=redundancy,
                           lightning_block=8, selection=selection)
    final, _ = run(params, x)
    keep = select_and_compact(params, Queries(x["q"]), LayerKV(x["k"], x["v"]), None, x["src"], x["lens"],
                              torch.zeros(2, dtype=torch.int64, device=DEV),
                              torch.zeros(2, dtype=torch.bool, device=DEV), x["scale"],
                              x["src"][:, :12].clone(), 12)
    ascending = select_topk(final, 12)
    assert torch.equal(keep, ascending if ordered else in_place_order(ascending, 2))
    assert ordered or not torch.equal(keep, ascending)


def _in_place_order_twin(row, tail):
    """The arrangement, one row in plain Python: the window stays last; kept positions
    below m = k - tail stay put; the others fill the evicted positions below m in order."""
    k = len(row)
    m = k - tail
    if m <= 0:
        return list(row)
    head = row[:m]
    fillers = iter([p for p in head if p >= m])
    out = [p if p in head else next(fillers) for p in range(m)]
    return out + list(row[m:])


@pytest.mark.parametrize("k,tail", [(40, 8), (40, 0), (8, 8), (64, 4)])
def test_in_place_order_matches_its_twin_and_moves_few_rows(k, tail):
    rand = torch.rand(2, 3, 4, 80)
    keep = select_topk(rand, k)
    got = in_place_order(keep, tail)
    for a, b in zip(got.reshape(-1, k).tolist(), keep.reshape(-1, k).tolist()):
        assert a == _in_place_order_twin(b, tail)
        assert sorted(a) == b  # the same tokens
        assert all(p >= j for j, p in enumerate(a))  # what compact_kv needs in place
        assert a[k - tail:] == b[k - tail:]  # the newest stay last, in order
        # stationary rows are never moved: at most the evicted count + tail rows move
        assert sum(p != j for j, p in enumerate(a)) <= (80 - k) + tail


@pytest.mark.parametrize("redundancy", ["none", "lightning"])
def test_triton_and_torch_backends_agree(monkeypatch, redundancy):
    lens = [40, 17, 33]
    x = make_inputs(lens, g=4, d=32, w=16)
    for buf in x["sb"]:
        buf.uniform_(0, 0.05)
    params = ScoringParams(redundancy=redundancy, lightning_block=8, sink=1, window=4)
    kw = dict(n_stored=torch.tensor([20, 0, 33], device=DEV), first=torch.tensor([False, True, False], device=DEV))
    monkeypatch.setenv(ENV_BACKEND, "ref")
    ref = run(params, x, **kw)
    monkeypatch.setenv(ENV_BACKEND, "triton")
    got = run(params, x, **kw)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("selection", ["recent", "random"])
def test_selection_controls_keep_budget_and_protection(selection):
    """The quality baselines: same k, same window/sink protection, score ignored."""
    x = make_inputs([12, 9])
    params = ScoringParams(window=2, sink=1, decay=0.0, pooling=1, selection=selection)
    final, _ = run(params, x)
    keep = select_topk(final, 6)
    for r, n in enumerate(x["lens"].tolist()):
        for row in keep[:, r].reshape(-1, 6).tolist():
            assert row == sorted(row) and max(row) < n
            assert {0, n - 2, n - 1} <= set(row)  # sink + window always kept
            if selection == "recent":
                assert row == [0] + list(range(n - 5, n))


@pytest.mark.parametrize("backend", ["ref", "triton"])
def test_a_follower_pool_keeps_one_agreed_token_set_in_every_layer_and_head(monkeypatch, backend):
    """A speculative draft's pool (other layer count, heads and width; an MLA-like latent
    row without values; a sliding-window layer) at the target's slots: each request keeps
    the k positions of the highest mean final score over the target's layers and heads, the
    same in all the draft's heads, protected window included; the target's own selection
    does not change."""
    monkeypatch.setenv(ENV_BACKEND, backend)
    lens, k = [30, 21], 12
    x = make_inputs(lens, n_layers=3, hkv=2, g=2, d=16, w=4)
    gen = torch.Generator().manual_seed(1)
    n_slots = x["k"][0].shape[0]
    draft = LayerKV([torch.randn(n_slots, 3, 8, generator=gen).to(DEV)],
                    [torch.randn(n_slots, 3, 8, generator=gen).to(DEV)],
                    recent_keys=[torch.randn(n_slots, 3, 8, generator=gen).to(DEV)],
                    recent_values=[torch.randn(n_slots, 3, 8, generator=gen).to(DEV)])
    latent = LayerKV([torch.randn(n_slots, 1, 24, generator=gen).to(DEV)], None)
    old = [t.clone() for t in (*draft.keys, *draft.values, *draft.recent_keys, *latent.keys)]
    params = ScoringParams(window=3, decay=0.0, pooling=1, sink=1)
    zeros = dict(n_stored=torch.zeros(2, dtype=torch.int64, device=DEV),
                 first=torch.zeros(2, dtype=torch.bool, device=DEV))
    final, _ = run(params, x, **zeros, score_buffers=None)
    target = LayerKV([t.clone() for t in x["k"]], [t.clone() for t in x["v"]])
    alone = select_and_compact(params, Queries(x["q"]), target, None, x["src"], x["lens"],
                               *zeros.values(), x["scale"], x["src"][:, :k].clone(), k)
    dst = x["src"][:, :k].clone()
    keep = select_and_compact(params, Queries(x["q"]), LayerKV(x["k"], x["v"]), None, x["src"],
                              x["lens"], *zeros.values(), x["scale"], dst, k, (draft, latent))
    assert torch.equal(keep, alone)
    for r, n in enumerate(lens):
        mean = final[:, r].mean(dim=(0, 1))  # over layers and heads: [S_max]
        agreed = sorted(torch.topk(mean, k).indices.tolist())
        assert {0, n - 3, n - 2, n - 1} <= set(agreed)  # sink and window
        src = x["src"][r]
        got = set()
        for j in range(k):
            row = old[0][src[:n]].eq(draft.keys[0][dst[r, j]]).all(-1).all(-1).nonzero()
            got.add(row.item())
            pos = row.item()
            assert torch.equal(draft.values[0][dst[r, j]], old[1][src[pos]])
            assert torch.equal(latent.keys[0][dst[r, j]], old[3][src[pos]])
        assert sorted(got) == agreed
        # the sliding-window layer holds the newest k tokens, in order
        assert torch.equal(draft.recent_keys[0][dst[r]], old[2][src[n - k:n]])
