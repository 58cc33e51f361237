"""The HF reference: teacher-forced decoding with Zipage's eviction, in plain transformers.

The model's own modules (embeddings, RMSNorms, projections, MLPs, rotary embedding, LM head)
run under a hand-written decode loop whose KV cache is a pair of tensors [B, Hkv, T, D] per
layer, so eviction is just a gather: every KV head keeps its own `budget` suffix tokens and
all heads keep the same number. Positions stay logical (RoPE uses prompt + step) while the
cache shrinks, as in the engine (keys are cached after RoPE, so nothing is re-rotated).

Schedule, step for step the engine's (sglang_zipage/budget.py, planner.py):
  step 0      the prompt's prefill gives the logits of reference token 0
  step i >= 1 decode forward of reference token i-1, giving the logits of token i. Before
              it, the cache holds the prompt plus `suffix` decode tokens (suffix = i - 1
              until the first compaction). When suffix >= budget + buffer the suffix is
              compacted to `budget` tokens, scored by the last W decode queries; then the
              forward runs on the compacted cache.
So the first compaction precedes step budget + buffer + 1 and the next ones come every
`buffer` steps. With the prompt compressed too (Eviction.own_prompt, --zipage-compress-prompt)
the suffix starts with the prompt, and a compaction also waits for a full window (W decode
queries), as the engine's request whose own prompt put it past its window's start does.
Eviction.scorer "calibrated" (or "mean") scores with HFReference.query_stats' queries at
the next position (query_stats.py) instead of the last W decode queries.
With a squeeze (Eviction.squeeze_to, squeeze_at), the request is compacted
to its floor before step squeeze_at (if it holds more) and keeps the floor as its budget, as
the engine squeezes a request under overload (budget.py A3). `schedule` gives the count of
compactions before every step.

Every text of a batch has the same prompt and continuation lengths, so the batch compacts
at once. Weights are the checkpoint's (bf16 for the bundled model); compute runs in `dtype`
(float32 by default: the CPU has no fast bf16 path). The engine computes in bf16, so the
two "full KV" runs differ slightly: that difference is the numerical noise floor reported
next to the engine-vs-reference comparison.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from sglang_zipage.harness.fidelity.selection import Eviction, rank_scores, select


def schedule(steps: int, ev: Optional[Eviction], prompt_len: int = 0) -> List[int]:
    """Compactions that happened before the forward that predicts reference token i, for
    i < steps (the suffix before step i >= 1 holds i - 1 tokens less those evicted, plus
    the prompt's ``prompt_len`` with ev.own_prompt)."""
    counts, n = [0], 0
    suffix = prompt_len if ev is not None and ev.own_prompt else 0
    budget = ev.budget if ev is not None else 0
    for step in range(1, steps):
        if ev is not None:
            if ev.squeeze_to and step == ev.squeeze_at:
                budget = ev.squeeze_to
                if suffix > budget:
                    suffix, n = budget, n + 1
            elif suffix >= budget + ev.buffer and step > ev.window:  # a full window
                suffix, n = budget, n + 1
        counts.append(n)
        suffix += 1
    return counts[:steps]


def compactions_before(step: int, ev: Optional[Eviction], prompt_len: int = 0) -> int:
    return schedule(step + 1, ev, prompt_len)[step]


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class HFReference:
    def __init__(self, model_path: str, dtype=torch.float32, device: str = "cpu", model=None):
        from transformers import AutoModelForCausalLM

        if model is None:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model = model.to(device=device, dtype=dtype).eval()
        cfg = self.model.config
        self.device, self.dtype = torch.device(device), dtype
        self.hq, self.hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.d ** -0.5
        self.core = self.model.model
        self.query_stats = None  # QueryStats of the calibrated scorers (query_stats.py)

    # ------------------------------------------------------------ forward
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: List, queries=None,
                 pre_rope=None):
        """ids [B, T] at logical positions [T]; appends to cache; returns last logits [B, V].
        queries: per-layer lists that receive this step's post-RoPE query [B, Hq, D];
        pre_rope(layer, q [B, Hq, T, D]): sees each layer's queries before RoPE."""
        b, t = ids.shape
        x = self.core.embed_tokens(ids)
        cos, sin = self.core.rotary_emb(x, positions[None, :].expand(b, t))
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]
        for li, layer in enumerate(self.core.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, t, self.hq, self.d).transpose(1, 2)
            k = attn.k_proj(h).view(b, t, self.hkv, self.d).transpose(1, 2)
            v = attn.v_proj(h).view(b, t, self.hkv, self.d).transpose(1, 2)
            if pre_rope is not None:
                pre_rope(li, q)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if cache[li] is None:
                cache[li] = (k, v)
            else:
                cache[li] = (torch.cat([cache[li][0], k], 2), torch.cat([cache[li][1], v], 2))
            kc, vc = cache[li]
            if queries is not None:
                queries[li].append(q[:, :, -1])
            o = F.scaled_dot_product_attention(q, kc, vc, is_causal=t > 1, scale=self.scale,
                                               enable_gqa=True)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, self.hq * self.d))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(self.core.norm(x[:, -1])).float()

    # ------------------------------------------------- calibrated queries
    @torch.no_grad()
    def calibrate(self, token_chunks):
        """query_stats.Accumulator of this model's pre-RoPE queries over ``token_chunks``
        (lists of token ids, each run from position 0); its ``stats(K)`` are the QueryStats.
        HF's rotate_half RoPE: neox pairs."""
        from sglang_zipage.query_stats import Accumulator

        acc = Accumulator(neox=True)
        for ids in token_chunks:
            ids = torch.tensor([ids], device=self.device)
            self._forward(ids, torch.arange(ids.shape[1], device=self.device),
                          [None] * len(self.core.layers),
                          pre_rope=lambda li, q: acc.add(li, q[0].transpose(0, 1), self.d))
        return acc

    def cos_sin(self, positions: int) -> torch.Tensor:
        """[positions, D] this model's RoPE table as SGLang keeps it: cos | sin of each pair."""
        x = torch.zeros(1, 1, self.d, device=self.device, dtype=self.dtype)
        cos, sin = self.core.rotary_emb(x, torch.arange(positions, device=self.device)[None])
        return torch.cat([cos[0, :, :self.d // 2], sin[0, :, :self.d // 2]], -1).float()

    def _expected(self, ev: Eviction, next_pos: int) -> torch.Tensor:
        """[L, W, Hq, D]: the calibrated queries of ``ev.scorer`` at the next position(s)."""
        from sglang_zipage.query_stats import GEOMETRIC, NEXT, expected_queries

        if self.query_stats is None:
            raise ValueError(f"scorer {ev.scorer!r} needs HFReference.query_stats")
        mean = ev.scorer == "mean"  # the single-mean baseline, at geometric offsets
        offsets = GEOMETRIC if mean else NEXT
        table = self.cos_sin(next_pos + offsets[-1] + 1)
        q = expected_queries(self.query_stats.queries(single_mean=mean), table,
                             torch.tensor([next_pos]), True, offsets)
        return q[:, 0].to(self.dtype)

    # ---------------------------------------------------------- compaction
    def _compact(self, cache, ring, stored, prompt_len: int, ev: Eviction, first: bool, gen,
                 next_pos: int = 0):
        expected = None if ev.scorer == "window" else self._expected(ev, next_pos)
        for li in range(len(cache)):
            k, v = cache[li]
            ks, vs = k[:, :, prompt_len:], v[:, :, prompt_len:]
            if expected is None:
                qw = torch.stack(list(ring[li]), dim=1)  # [B, W, Hq, D]
            else:  # no stored queries: the calibrated ones at the next position
                qw = expected[li][None].expand(k.shape[0], -1, -1, -1)
            final, g = rank_scores(ev, qw, ks, stored[li], first, self.scale, gen)
            keep = select(final, ev.budget)  # [B, Hkv, k]
            idx = keep[..., None].expand(-1, -1, -1, self.d)
            cache[li] = (torch.cat([k[:, :, :prompt_len], ks.gather(2, idx)], 2),
                         torch.cat([v[:, :, :prompt_len], vs.gather(2, idx)], 2))
            stored[li] = g.gather(-1, keep)

    # ------------------------------------------------------------- public
    @torch.no_grad()
    def teacher_forced(self, prompts: torch.Tensor, refs: torch.Tensor,
                       ev: Optional[Eviction] = None, progress=None) -> Dict:
        """prompts [B, P], refs [B, C] token ids. Returns per step (lists [B][C]): logprob of
        the reference token, top-1 token; and the compaction count before each step."""
        prompts, refs = prompts.to(self.device), refs.to(self.device)
        b, p = prompts.shape
        c = refs.shape[1]
        n_layers = len(self.core.layers)
        cache = [None] * n_layers
        w = ev.window if ev is not None else 1
        ring = [deque(maxlen=w) for _ in range(n_layers)]
        stored = [None] * n_layers
        gen = torch.Generator().manual_seed(ev.seed) if ev is not None else None
        lps, tops, ncs = [], [], []
        compactions = 0

        def record(logits, step):
            lp = torch.log_softmax(logits, dim=-1)
            lps.append(lp.gather(1, refs[:, step:step + 1])[:, 0].cpu())
            tops.append(logits.argmax(-1).cpu())
            ncs.append(compactions)

        record(self._forward(prompts, torch.arange(p, device=self.device), cache), 0)
        now = ev  # the eviction in force: its budget drops to the floor at a squeeze
        kept = 0 if ev is not None and ev.own_prompt else p  # columns never compressed
        for step in range(1, c):
            suffix = cache[0][0].shape[2] - kept
            squeeze = ev is not None and ev.squeeze_to and step == ev.squeeze_at
            if squeeze:
                now = dataclasses.replace(ev, budget=ev.squeeze_to, squeeze_to=0)
            full = ev is not None and len(ring[0]) == ev.window
            if now is not None and (suffix > now.budget if squeeze
                                    else suffix >= now.limit and full):
                assert full
                self._compact(cache, ring, stored, kept, now, compactions == 0, gen,
                              next_pos=p + step - 1)
                compactions += 1
            pos = torch.tensor([p + step - 1], device=self.device)
            logits = self._forward(refs[:, step - 1:step], pos, cache,
                                   queries=ring if ev is not None else None)
            record(logits, step)
            if progress is not None and step % 128 == 0:
                progress(step, c)
        assert ncs == schedule(c, ev, p)
        return {"logprob": torch.stack(lps, 1).tolist(), "top1": torch.stack(tops, 1).tolist(),
                "compactions_before": ncs}

    def forced_rows(self, items, rows: Dict[str, Optional[Eviction]], log=print):
        """``teacher_forced`` over the texts of ``items`` (texts.Item) once per named eviction
        (None: full KV). Returns (runs, seconds): runs[name][text id] = {"logprob", "top1",
        "compactions_before"}, the form metrics.compare takes."""
        prompts = torch.tensor([it.prompt_ids for it in items])
        refs = torch.tensor([it.ref_ids for it in items])
        runs, seconds = {}, {}
        for name, ev in rows.items():
            t0 = time.time()
            out = self.teacher_forced(prompts, refs, ev)
            seconds[name] = round(time.time() - t0, 1)
            runs[name] = {it.id: {"logprob": out["logprob"][i], "top1": out["top1"][i],
                                  "compactions_before": out["compactions_before"]}
                          for i, it in enumerate(items)}
            log(f"{name}: {seconds[name]} s")
        return runs, seconds


def add_reference_args(p, prompt_len: int, scorer: bool = False) -> None:
    """The command-line settings of a reference-only fidelity script (squeeze.py,
    own_prompt.py): texts, lengths, budget, buffer, window, where it runs and its output;
    ``scorer``: --scorer too (for a script whose rows do not name their scorers)."""
    a = p.add_argument
    a("--n-texts", type=int, default=4)
    a("--long-enough", action="store_true", help="pick the --n-texts texts among those of at "
      "least --prompt-len + --cont-len tokens (fewer where fewer are)")
    a("--prompt-len", type=int, default=prompt_len)
    a("--cont-len", type=int, default=512)
    a("--budget", type=int, default=128)
    a("--buffer", type=int, default=32)
    a("--window", type=int, default=16)
    a("--device", default="cpu")
    a("--dtype", default="float32", choices=["float32", "bfloat16"])
    a("--model", default=None, help="model folder (default: the bundled SmolLM2)")
    if scorer:
        a("--scorer", default="window", choices=["window", "calibrated"],
          help="calibrated: the model's query statistics (calibrate.stats_file)")
    a("--out", required=True)


def for_texts(model: Optional[str], n_texts: int, prompt_len: int, cont_len: int,
              dtype: str = "float32", device: str = "cpu", long_enough: bool = False,
              scorer: str = "window"):
    """(model path, texts.Item list, HFReference): the fidelity texts cut into prompt and
    continuation with the model's tokenizer (the bundled SmolLM2 when ``model`` is None);
    ``long_enough``: only texts of at least prompt + continuation tokens (texts.load_items);
    ``scorer`` calibrated: the reference holds the model's query statistics."""
    from transformers import AutoTokenizer

    from sglang_zipage.harness.fidelity.texts import load_items
    from sglang_zipage.model import bundled_model_path

    model = model or bundled_model_path()
    items = load_items(AutoTokenizer.from_pretrained(model), n_texts, prompt_len, cont_len,
                       long_enough)
    ref = HFReference(model, dtype=getattr(torch, dtype), device=device)
    if scorer == "calibrated":
        from sglang_zipage.calibrate import stats_file
        from sglang_zipage.query_stats import QueryStats

        ref.query_stats = QueryStats.load(str(stats_file("", model)))
    return model, items, ref


def write_result(path: str, args, model: str, items, seconds: Dict, rows: Dict, **extra) -> None:
    """A reference-only fidelity result (squeeze.py, own_prompt.py) with its provenance."""
    from sglang_zipage.harness import record

    record.write_json({
        "command": record.command_line(), "commit": record.git_commit(dirty=True),
        "versions": record.versions(), "device": record.gpu_name(args.device),
        "model": model, "texts": [it.id for it in items], "settings": vars(args),
        "implementation": "hf reference (sglang_zipage/harness/fidelity/hf_reference.py)",
        **extra, "seconds": seconds, "rows": rows}, path)
