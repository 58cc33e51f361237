"""Smoke test of the fidelity benchmark (benchmarks/fidelity; its shared pieces in
sglang_zipage/harness/fidelity), CPU only, a few seconds.

- The HF reference's eviction ranking (harness/fidelity/selection.py, written from the
  algorithm's description) equals sglang_zipage.scoring.score_tokens on random inputs,
  for every scoring variant: so engine-vs-reference differences measure the integration.
- The HF reference's hand-written decode loop gives the transformers model's own
  log-probabilities when nothing is evicted, and compacts on the engine's schedule.
- The forcing logit processor records the raw log-probability and top-1, then forces.
- The metrics on a toy case, and the committed texts are long enough for the full set.
Run: .venv/bin/python -m pytest tests/unit/test_fidelity_smoke.py -q
"""

import json
from types import SimpleNamespace

import pytest
import torch

from sglang_zipage.harness.fidelity import metrics
from sglang_zipage.harness.fidelity.hf_reference import HFReference, compactions_before
from sglang_zipage.harness.fidelity.selection import Eviction, rank_scores, select


@pytest.fixture(autouse=True)
def torch_twins(monkeypatch):
    monkeypatch.setenv("SGLANG_ZIPAGE_KERNELS", "ref")


@pytest.mark.parametrize("decay,pooling,redundancy,first", [
    (0.0, 1, "none", True), (0.8, 1, "none", False), (0.8, 1, "full", False),
    (0.8, 5, "full", True), (0.8, 5, "lightning", True)])
def test_reference_ranking_equals_engine_scoring(decay, pooling, redundancy, first):
    from sglang_zipage.kv_layout import LayerKV
    from sglang_zipage.scoring import Queries, ScoringParams, score_tokens

    gen = torch.Generator().manual_seed(1)
    b, hkv, g, d, w, s, n_stored, layers = 2, 2, 3, 16, 4, 150, 70, 2
    ev = Eviction(budget=80, buffer=70, window=w, decay=decay, pooling=pooling,
                  redundancy=redundancy)
    slots = torch.randperm(b * s + 7, generator=gen)[:b * s].view(b, s) + 1
    n_slots = b * s + 8
    k_buffers = [torch.randn(n_slots, hkv, d, generator=gen) for _ in range(layers)]
    score_buffers = [torch.rand(n_slots, hkv, generator=gen) for _ in range(layers)]
    q = torch.randn(layers, b, w, hkv * g, d, generator=gen)
    params = ScoringParams(window=w, decay=decay, redundancy=redundancy, pooling=pooling)
    final_e, g_e = score_tokens(params, Queries(q), LayerKV(k_buffers, None), score_buffers if decay else None, slots,
                                torch.full((b,), s), torch.full((b,), n_stored),
                                torch.full((b,), first), d ** -0.5)
    for layer in range(layers):
        keys = k_buffers[layer][slots].permute(0, 2, 1, 3)  # [B, Hkv, S, D]
        stored = score_buffers[layer][slots[:, :n_stored]].permute(0, 2, 1)
        final_r, g_r = rank_scores(ev, q[layer], keys, stored, first, d ** -0.5)
        torch.testing.assert_close(g_r, g_e[layer], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(final_r, final_e[layer], rtol=1e-5, atol=1e-6)
        assert torch.equal(select(final_r, ev.budget), select(final_e[layer], ev.budget))


def test_controls_keep_window_and_budget():
    gen = torch.Generator().manual_seed(0)
    keys, q = torch.randn(1, 2, 40, 8), torch.randn(1, 4, 4, 8)
    for policy in ("random", "recent"):
        ev = Eviction(budget=10, buffer=30, window=4, policy=policy)
        keep = select(rank_scores(ev, q, keys, None, True, 0.3, gen)[0], ev.budget)
        assert keep.shape == (1, 2, 10) and (keep[..., -4:] == torch.arange(36, 40)).all()
        if policy == "recent":
            assert (keep == torch.arange(30, 40)).all()


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def test_hf_reference_matches_transformers_and_engine_schedule():
    model = tiny_llama()
    ref = HFReference(None, model=model)
    ids = torch.randint(3, 97, (2, 90), generator=torch.Generator().manual_seed(0))
    p = 10
    out = ref.teacher_forced(ids[:, :p], ids[:, p:])
    with torch.no_grad():
        lp = model(ids).logits.float().log_softmax(-1)[:, p - 1:-1]
    want = lp.gather(-1, ids[:, p:, None])[..., 0]
    torch.testing.assert_close(torch.tensor(out["logprob"]), want, rtol=1e-4, atol=1e-4)
    ev = Eviction(budget=20, buffer=16, window=8, redundancy="full")
    comp = ref.teacher_forced(ids[:, :p], ids[:, p:], ev)
    assert comp["compactions_before"][:37] == [0] * 37  # first compaction before step 37
    assert comp["compactions_before"][37] == 1 and comp["compactions_before"][53] == 2
    assert comp["logprob"][0][:37] == pytest.approx(out["logprob"][0][:37], abs=1e-5)
    assert compactions_before(36, ev) == 0 and compactions_before(37, ev) == 1
    # squeezed to 10 before step 45 (27 tokens held), then its limit is 10 + 16
    squeezed = Eviction(budget=20, buffer=16, window=8, redundancy="full", squeeze_to=10,
                        squeeze_at=45)
    sq = ref.teacher_forced(ids[:, :p], ids[:, p:], squeezed)
    counts = sq["compactions_before"]
    assert counts[44] == 1 and counts[45] == 2 and counts[60] == 2 and counts[61] == 3
    assert sq["logprob"][0][:45] == pytest.approx(comp["logprob"][0][:45], abs=1e-6)
    assert sq["logprob"][0][45:] != pytest.approx(comp["logprob"][0][45:], abs=1e-6)
    # the prompt compressed too (a 40-token prompt, limit 36): once the window is full
    owned = Eviction(budget=20, buffer=16, window=8, redundancy="full", own_prompt=True)
    pr = ref.teacher_forced(ids[:, :40], ids[:, 40:], owned)
    assert pr["compactions_before"][:9] == [0] * 9 and pr["compactions_before"][9] == 1
    assert pr["compactions_before"][25] == 2  # then every buffer tokens
    kept = ref.teacher_forced(ids[:, :40], ids[:, 40:], ev)
    assert pr["logprob"][0][9:] != pytest.approx(kept["logprob"][0][9:], abs=1e-6)


def test_force_reference_records_raw_logprob_then_forces(tmp_path):
    from sglang_zipage.forcing import ForceReference

    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 0.0]])
    raw = logits.clone()
    reqs = [SimpleNamespace(kv_committed_len=5, output_ids=[], zipage=None) for _ in range(2)]
    params = [{"__req__": r, "ref": [2], "out": str(tmp_path), "key": f"t{i}"}
              for i, r in enumerate(reqs)]
    out = ForceReference()(logits, params)
    assert out.argmax(-1).tolist() == [2, 2]
    for i in range(2):
        rec = json.load(open(tmp_path / f"t{i}.json"))
        assert rec["logprob"][0] == pytest.approx(raw[i].log_softmax(-1)[2].item())
        assert rec["top1"] == [raw[i].argmax().item()] and rec["output_len"] == [0]


def test_metrics_toy_case():
    full = {"a": {"logprob": [-1.0] * 6, "top1": [1] * 6, "compactions_before": [0] * 6}}
    comp = {"a": {"logprob": [-1.0] * 3 + [-2.0] * 3, "top1": [1, 1, 1, 1, 2, 1],
                  "compactions_before": [0, 0, 0, 1, 1, 1]}}
    r = metrics.compare(comp, full, {"a": [1] * 6})
    assert r["nll_ratio"] == pytest.approx(2.0) and r["scored_tokens"] == 3
    assert r["top1_agreement"] == pytest.approx(2 / 3)
    assert metrics.repetition_rate("a b c d a b c d") == pytest.approx(0.2)


def test_committed_texts_cover_the_full_set():
    from sglang_zipage.harness.fidelity.texts import load_numeric_problems, load_raw

    raw = load_raw()
    assert len(raw) >= 10 and {t["kind"] for t in raw} == {"english", "math"}
    assert all(len(t["text"]) > 6000 and t["licence"] for t in raw)
    assert len(load_numeric_problems()) >= 50


def test_long_enough_texts_are_picked_among_those_that_hold_prompt_and_continuation():
    from transformers import AutoTokenizer

    from sglang_zipage.harness.fidelity.texts import load_items
    from sglang_zipage.model import bundled_model_path

    tok = AutoTokenizer.from_pretrained(bundled_model_path())
    with pytest.raises(ValueError, match="tokens <"):
        load_items(tok, 12, 64, 3600)  # the shortest text has 1,943 tokens
    items = load_items(tok, 12, 64, 3600, long_enough=True)
    assert 0 < len(items) < 12 and {it.kind for it in items} == {"english", "math"}
    assert all(len(it.prompt_ids) == 64 and len(it.ref_ids) == 3600 for it in items)
