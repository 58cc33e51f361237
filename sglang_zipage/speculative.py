"""Speculative decoding under compression: which algorithms run with zipage, and how many KV
columns each decode step holds past a request's committed tokens.

SGLang 0.5.17's EAGLE, EAGLE3, NEXTN (MTP: SGLang's alias of EAGLE), STANDALONE and NGRAM
workers run with compression (docs/internals/sglang-speculative.md): the draft's pool follows
the target's compactions (runtime.follow), the step in flight's draft and verify columns are
never scored (request_state.in_flight), admission books steps in token time (admission.py).
Everything else is refused here, by name, with the reason. Reads ServerArgs after SGLang's
own post-init (NEXTN is EAGLE by then; multi-layer EAGLE forced on for the models that need it).
"""

from __future__ import annotations

from typing import List, Optional

from sglang_zipage.config import ZipageConfig

SUPPORTED = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
# On a PD decode server SGLang builds the first draft's input from what the prefill server sends
# for EAGLE-family drafts only (ScheduleBatch's build_disagg_draft_input); NEXTN ran there with
# compression (benchmarks/results/pd-check-spec-h100.json). The others have not been tried.
ON_A_DECODE_SERVER = ("EAGLE", "EAGLE3", "NEXTN")


def refusals(server_args, config: ZipageConfig) -> List[str]:
    """Reasons this speculative decoding setup cannot run with zipage (empty = fine)."""
    algorithm = server_args.speculative_algorithm
    if algorithm is None:
        return []
    flag = f"--speculative-algorithm {algorithm}"
    if str(algorithm).upper() not in SUPPORTED:
        return [f"{flag}: its draft keeps KV that zipage's compactions do not move; zipage "
                f"compresses with {', '.join(SUPPORTED)}"]
    bad = []
    if config.scorer != "calibrated":
        bad.append(f"{flag} needs the calibrated scorer (--zipage-scorer calibrated or auto, "
                   f"with the model's statistics: python -m sglang_zipage.calibrate): the "
                   f"target runs no decode step whose queries the window scorer would keep")
    if (server_args.page_size or 1) != 1:
        bad.append(f"{flag} with --page-size {server_args.page_size}: the step in flight's "
                   f"columns follow the kept tokens one slot at a time; zipage runs it with "
                   f"--page-size 1")
    if config.async_compaction:
        bad.append(f"{flag} with --zipage-async: a compaction must land before the next draft "
                   f"reads its pool")
    if getattr(server_args, "enable_multi_layer_eagle", False):
        bad.append(f"{flag} with multi-layer EAGLE (--enable-multi-layer-eagle, forced on for "
                   f"MiMo-V2 and Step-3.5): one draft pool and one boundary stash per step, "
                   f"which zipage's compactions do not move yet")
    if (getattr(server_args, "disaggregation_mode", None) == "decode"
            and str(algorithm).upper() not in ON_A_DECODE_SERVER):
        bad.append(f"{flag} on a PD decode server: not tried (SGLang's decode server builds "
                   f"the first draft's input from the prefill server for "
                   f"{', '.join(ON_A_DECODE_SERVER)} only)")
    return bad


def tokens_per_step(server_args) -> int:
    """The most tokens a decode step commits: speculative decoding's draft tokens, else 1."""
    if server_args.speculative_algorithm is None:
        return 1
    return max(1, server_args.speculative_num_draft_tokens or 1)


def reserve(server_args) -> int:
    """KV columns speculative decoding allocates past a request's committed tokens at each
    decode step (SGLang's draft and verify tokens, doubled for the overlap scheduler's lag):
    a newcomer holds them from its first decode step on; 0 without speculative decoding."""
    if server_args.speculative_algorithm is None:
        return 0
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    return get_alloc_reserve_per_decode(server_args)


def running_cap_note(max_running: int, pool_tokens: int, config: ZipageConfig) -> Optional[str]:
    """What to say at startup when the running-request cap binds before the compressed pool:
    SGLang sets --max-running-requests to 48 under speculative decoding when it is not given
    (arg_groups/speculative_hook.py), which a stock pool of long outputs about fills and a
    compressed one holds several times over (speculative-steady-cap48-h100.json: 48 running on both
    engines, zipage never compacted)."""
    holds = pool_tokens // (config.kv_budget + config.buffer)
    if not max_running or max_running >= holds:
        return None
    return (f"speculative decoding runs at most {max_running} requests (--max-running-requests; "
            f"SGLang sets 48 under speculative decoding when it is not given) where the "
            f"compressed pool holds about {holds} at budget {config.kv_budget} + buffer "
            f"{config.buffer}: raise --max-running-requests to use the room compression makes "
            f"(with flashinfer, CUDA graphs past about 200 requests may not fit its workspace: "
            f"--cuda-graph-max-bs-decode, docs/speculative.md)")
