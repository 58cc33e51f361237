"""Teacher forcing through the SGLang engine: a custom logit processor that records, then forces.

Why not SGLang's returned logprobs: in SGLang 0.5.17 ``Sampler.forward`` applies custom logit
processors first (``_preprocess_logits``) and computes the returned logprobs (``return_logprob``,
``top_logprobs_num``, ``token_ids_logprob``, and ``SGLANG_RETURN_ORIGINAL_LOGPROB`` too) from the
processed logits, so a processor that masks every token but the reference one makes the
returned logprob of that token 0. And prefill logprobs of prompt + reference
(``logprob_start_len``) would run one full-KV prefill: no decode step, no compression.

So the processor does the measuring itself. It runs inside the scheduler process, in the
sampler of every step of the request (the prefill's last position, then each decode step),
on the raw logits of that step: the decode forward of the real engine (zipage hooks, the
compacted KV, logical positions, the attention backend). For row i it
  1. takes log_softmax of the raw logits (fp32): the log-probability of the reference token
     and the top-1 token, plus the request's zipage state (compactions so far, KV length);
  2. masks every logit except the reference token's, so greedy sampling emits it.
Records stay on the Req and are written as one JSON file per request when its last
reference token is forced: ``{out}/{key}.json``.

The step index is a per-request call counter (``req._fid_calls``). It equals
``len(req.output_ids)`` without the overlap scheduler (the runner disables it); each record
keeps both so that a mismatch shows. The class is pickled by reference (dill): the scheduler
process imports it from this package. Used by the fidelity benchmark and by the e2e tests
that compare compressed decoding with full KV (tests/e2e/zipage_server.py).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor


class ForceReference(CustomLogitProcessor):
    def __call__(self, logits: torch.Tensor,
                 custom_param_list: Optional[List[Dict[str, Any]]] = None) -> torch.Tensor:
        if not custom_param_list:
            return logits
        rows, targets, reqs, steps = [], [], [], []
        for i, params in enumerate(custom_param_list):
            req = params.get("__req__") if params else None
            if req is None or "ref" not in params:
                continue
            step = getattr(req, "_fid_calls", 0)
            req._fid_calls = step + 1
            if step >= len(params["ref"]):
                continue  # past the reference (overlap scheduling may run one more step)
            rows.append(i)
            targets.append(params["ref"][step])
            reqs.append((req, params))
            steps.append(step)
        if not rows:
            return logits
        idx = torch.tensor(rows, device=logits.device)
        tgt = torch.tensor(targets, device=logits.device)
        raw = logits[idx].float()
        lp = torch.log_softmax(raw, dim=-1).gather(1, tgt[:, None])[:, 0].tolist()
        top1 = raw.argmax(dim=-1).tolist()
        logits[idx] = float("-inf")
        logits[idx, tgt] = 0.0
        for (req, params), step, l, t in zip(reqs, steps, lp, top1):
            st = getattr(req, "zipage", None)
            rec = getattr(req, "_fid_rec", None)
            if rec is None:
                rec = req._fid_rec = {"logprob": [], "top1": [], "compactions_before": [],
                                      "kv_len": [], "output_len": []}
            rec["logprob"].append(l)
            rec["top1"].append(t)
            rec["compactions_before"].append(st.compactions if st is not None else 0)
            rec["kv_len"].append(int(req.kv_committed_len))
            rec["output_len"].append(len(req.output_ids))
            if step == len(params["ref"]) - 1:
                path = os.path.join(params["out"], f"{params['key']}.json")
                with open(path + ".tmp", "w") as f:
                    json.dump(rec, f)
                os.replace(path + ".tmp", path)
        return logits
