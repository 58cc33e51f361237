#!/usr/bin/env python3
"""One engine configuration of the fidelity benchmark, in its own process.

run_fidelity.py writes a spec (JSON) and starts
    python engine_runner.py SPEC.json OUT.json
which starts ``sglang_zipage.Engine`` with the spec's ``engine_kwargs`` (``zipage_enabled=False``
for the full-KV run: no hook is installed, SGLang's own code runs), then
  1. teacher forcing: every text's request at once, greedy, max_new_tokens = the reference
     length, with sglang_zipage.forcing.ForceReference as custom logit processor;
     checks that the engine emitted exactly the reference tokens;
  2. free running: every free prompt at once, greedy, stops at EOS or free_max_new;
and writes OUT.json: per-text records, the free-running outputs, the zipage counters and
timings. A fresh process per configuration: zipage settings are server-wide and are read
by SGLang's scheduler process when it starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time

from sglang_zipage.harness import probe


def zipage_state(engine):
    try:
        return probe.zipage_state(engine)
    except Exception as e:  # the counters are informative only
        return {"error": repr(e)}


def main(spec_path: str, out_path: str) -> None:
    spec = json.load(open(spec_path))
    from sglang_zipage import Engine
    from sglang_zipage.forcing import ForceReference

    t0 = time.time()
    engine = Engine(**spec["engine_kwargs"])
    result = {"name": spec["name"], "engine_kwargs": spec["engine_kwargs"],
              "zipage_config": (dataclasses.asdict(engine.zipage_config)
                                if spec["engine_kwargs"].get("zipage_enabled", True) else None),
              "start_s": time.time() - t0}
    try:
        items = spec["items"]
        rec_dir = tempfile.mkdtemp(prefix="fidelity-rec-")
        proc = ForceReference.to_str()
        t1 = time.time()
        outs = engine.generate(
            input_ids=[it["prompt_ids"] for it in items],
            sampling_params=[{"temperature": 0.0, "max_new_tokens": len(it["ref_ids"]),
                              "ignore_eos": True,
                              "custom_params": {"ref": it["ref_ids"], "out": rec_dir,
                                                "key": it["id"]}} for it in items],
            custom_logit_processor=[proc] * len(items))
        result["forced_s"] = time.time() - t1
        result["zipage_after_forced"] = zipage_state(engine)
        forced = {}
        for it, out in zip(items, outs):
            path = os.path.join(rec_dir, it["id"] + ".json")
            if not os.path.exists(path):
                raise RuntimeError(f"{spec['name']}: no record for {it['id']} (processor not run?)")
            rec = json.load(open(path))
            emitted = list(out["output_ids"])
            rec["forced_ok"] = emitted == it["ref_ids"]
            rec["steps_match_output_len"] = rec["output_len"] == list(range(len(it["ref_ids"])))
            forced[it["id"]] = rec
        shutil.rmtree(rec_dir, ignore_errors=True)
        result["forced"] = forced
        free = spec.get("free") or []
        if free:
            t2 = time.time()
            outs = engine.generate(input_ids=[f["prompt_ids"] for f in free],
                                   sampling_params={"temperature": 0.0,
                                                    "max_new_tokens": spec["free_max_new"]})
            result["free_s"] = time.time() - t2
            result["free"] = {f["id"]: {"text": o["text"],
                                        "completion_tokens": o["meta_info"]["completion_tokens"],
                                        "finish_reason": o["meta_info"].get("finish_reason")}
                              for f, o in zip(free, outs)}
            result["zipage_after_free"] = zipage_state(engine)
    finally:
        engine.shutdown()
    result["total_s"] = time.time() - t0
    with open(out_path + ".tmp", "w") as f:
        json.dump(result, f, default=str)
    os.replace(out_path + ".tmp", out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
