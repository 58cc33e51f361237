"""Decode CUDA graphs under zipage: SGLang's server arguments for a GPU get graphs up to the
batch a budget range lets run (server_args.graph_max_bs), the runtime reads the largest
one SGLang captures, and a decode step of more requests than that is counted and said once
(SGLang runs it eagerly: 72 ms a step at 657 requests on the H200 where the step line with
graphs predicts ~46)."""

import logging
import os

import torch

from sglang_zipage.counters import Counters
from sglang_zipage.engine import checked
from sglang_zipage.harness.engines import MODELS
from sglang_zipage.server_args import decode_graph_max_bs

GPU_ARGS = dict(model_path=os.path.join(MODELS, "qwen3-8b-dummy"), load_format="dummy",
                skip_tokenizer_init=True, device="cuda", attention_backend="flashinfer")


def test_sglang_captures_the_graphs_a_budget_range_lets_run():
    squeezed, _ = checked(zipage_min_kv_budget=1024, **GPU_ARGS)
    assert squeezed.cuda_graph_config.decode.bs[-3:] == [960, 992, 1024]
    assert decode_graph_max_bs(squeezed, torch.device("cuda")) == 1024
    one_budget, _ = checked(**GPU_ARGS)
    assert decode_graph_max_bs(one_budget, torch.device("cuda")) == 512
    given, _ = checked(zipage_min_kv_budget=1024, cuda_graph_max_bs_decode=96, **GPU_ARGS)
    assert decode_graph_max_bs(given, torch.device("cuda")) == 96
    eager, _ = checked(disable_cuda_graph=True, **GPU_ARGS)
    assert decode_graph_max_bs(eager, torch.device("cuda")) is None
    assert decode_graph_max_bs(squeezed, torch.device("cpu")) is None


def test_steps_past_the_largest_graph_are_counted_and_said_once(caplog):
    stats = Counters()
    stats.graph_max_bs = 4
    with caplog.at_level(logging.WARNING, logger="sglang_zipage"):
        for n in (3, 4, 5, 6, 4):
            stats.step(n, 0)
    assert stats["decode_steps_past_graphs"] == 2
    said = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert len(said) == 1 and "5 requests" in said[0] and "(4)" in said[0], said
    no_graphs = Counters()  # graph_max_bs None: the CPU, or graphs off
    no_graphs.step(1000, 0)
    assert no_graphs["decode_steps_past_graphs"] == 0
