"""The hook bodies of SGLang's scheduler process (the table is in hooks.py).

Thin: each reads SGLang objects, calls the ZipageRuntime (runtime.py) and writes results
back. ``RUNTIME`` is this process's runtime, once hooks.install made it.
"""

from __future__ import annotations

RUNTIME = None  # the ZipageRuntime of this process, once installed with zipage enabled


def after_alloc_memory_pool(result, model_runner, *args, **kwargs):
    if model_runner.is_draft_worker:  # a speculative draft's pool, after the target's
        RUNTIME.follow(model_runner)
    else:
        RUNTIME.attach(model_runner)


def remember_kv_memory(result, kvc, *args, **kwargs):
    RUNTIME.kv_memory_bytes = result  # what SGLang could give the pool (memory.py M1, M3)
    return result


def pool_makes_room(original, kvc, *args, **kwargs):
    """SGLang sized the pool; zipage's buffers take their share of the memory SGLang could
    give it (memory.py), and where the pool must make room SGLang's own configurator re-sizes
    it (and its request cap) for the tokens that remain. A share that cannot hold them refuses
    the start (proc.Refused: the launcher or Engine says why, no traceback)."""
    config = original(kvc, *args, **kwargs)
    if kvc.is_draft_worker:
        return config
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    from sglang_zipage import kv_layout, memory

    configurator = create_memory_pool_configurator(kvc)
    cell = int(configurator._cell_size)  # KV bytes per token of max_total_num_tokens
    page = kvc.page_size
    arch = (kvc.model_config.hf_config.architectures or ["this model"])[0]
    shapes = kv_layout.buffer_shapes(kvc.model, mla=bool(kvc.use_mla_backend),
                                     dtype_bytes=kvc.model_dtype.itemsize,
                                     global_scores=RUNTIME.config.decay > 0,
                                     stats_queries=RUNTIME.stats_queries(kvc.server_args.model_path))
    stock = config.max_total_num_tokens
    try:
        plan = RUNTIME.plan_memory(
            shapes, stock_pool_tokens=stock, cell_bytes=cell,
            available_bytes=getattr(RUNTIME, "kv_memory_bytes", None) or stock * cell,
            max_running=config.max_running_requests, page=page, model=arch)
    except memory.NoRoom as e:
        from sglang_zipage.proc import Refused

        raise Refused(str(e)) from None
    if plan.pool_tokens == stock:
        return config
    new = configurator.calculate_pool_sizes_from_max_tokens(plan.pool_tokens, page)
    new.max_running_requests = min(config.max_running_requests,
                                   kvc.resolve_max_num_reqs(new.max_total_num_tokens))
    new = configurator.finalize_with_max_running_requests(new)
    new.mem_fraction_static = config.mem_fraction_static
    return new


def stash_mla_query(result, attention, *args, **kwargs):
    RUNTIME.stash_query(attention.layer_id, result[0])  # (q_nope, q_pe, k_pe)
    return result


def capture_queries(original, layer, q, k, v, forward_batch, *args, **kwargs):
    if forward_batch.forward_mode.is_decode() and RUNTIME.ready:
        RUNTIME.capture(layer.layer_id, q, kwargs.get("q_rope"), forward_batch)
    elif RUNTIME.calibration is not None and forward_batch.forward_mode.is_extend():
        RUNTIME.calibration.add(layer, q, kwargs.get("q_rope"), forward_batch)
    return original(layer, q, k, v, forward_batch, *args, **kwargs)


def logical_positions(result, cls, batch, *args, **kwargs):
    """A decode step's positions (speculative decoding: the draft's topk rows, the verify's
    and the draft extend's draft tokens, per request) are its physical lengths plus the
    request's offset."""
    mode = result.forward_mode
    if (batch is not None and RUNTIME.ready and result.positions is not None
            and (mode.is_decode() or mode.is_target_verify() or mode.is_draft_extend_v2())):
        offsets = RUNTIME.position_offsets(batch)
        if offsets is not None:
            rows = result.positions.numel() // offsets.numel()  # per request
            offsets = offsets.repeat_interleave(rows).to(result.positions.dtype)
            result.positions = result.positions + offsets
            if result.spec_info is not None and mode.is_decode():
                result.zipage_offsets = offsets  # (physical_draft_lengths)
    return result


def physical_draft_lengths(original, backend, forward_batch, *args, **kwargs):
    """The multi-step draft backends lay the draft's KV index out by its positions, read as
    the requests' physical lengths: they see those, the model its logical positions."""
    offsets = getattr(forward_batch, "zipage_offsets", None)
    if offsets is None:
        return original(backend, forward_batch, *args, **kwargs)
    logical = forward_batch.positions
    physical = logical.clone()
    physical[:offsets.numel()] -= offsets
    forward_batch.positions = physical
    try:
        return original(backend, forward_batch, *args, **kwargs)
    finally:
        forward_batch.positions = logical


def published_lengths(original, future_map, batch, *args, **kwargs):
    """Speculative decoding with overlap: a step reads its lengths from what the step before
    published on the device, which still counts the columns compacted away since; they are
    taken off (new tensors: the step before may still hold the old ones)."""
    if batch.spec_info is None:
        return original(future_map, batch, *args, **kwargs)
    before = batch.seq_lens
    result = original(future_map, batch, *args, **kwargs)
    evicted = RUNTIME.unpublished(batch) if RUNTIME.ready else None
    if evicted is not None and batch.seq_lens is not before:
        seq_lens = batch.seq_lens
        batch.seq_lens = seq_lens - evicted.to(seq_lens.device, seq_lens.dtype, non_blocking=True)
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu - evicted.to(batch.seq_lens_cpu.dtype)
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    return result


def flush_before_forward(original, worker, *args, **kwargs):
    RUNTIME.flush()
    return original(worker, *args, **kwargs)


def compress_before_mem_check(batch, selected_indices=None):
    if selected_indices is None and RUNTIME.ready:
        RUNTIME.before_decode(batch)


def room_for_waiting(scheduler, running_batch, *args, **kwargs):
    if RUNTIME.ready and RUNTIME.budget.elastic:
        RUNTIME.admit_pressure(scheduler.waiting_queue, running_batch,
                               scheduler.max_running_requests,
                               scheduler.new_token_ratio_tracker.current)


def retract_compressed_last(original, reqs, server_args):
    order = original(reqs, server_args)
    # Most-preferred first; compressed requests go first (kept longest): their lossy
    # state can only be rebuilt by re-prefill plus a new compaction.
    return sorted(order, key=lambda i: not is_compressed(reqs[i]))


def running_reserve(original, adder, req):
    reserve = RUNTIME.running_reserve(req)
    if reserve is None:  # compression off for this request: SGLang's own estimate
        return RUNTIME.stock_reserve(req) * adder.new_token_ratio
    return reserve


def book_running_growth(result, adder, *args, **kwargs):
    running = adder.running_batch.reqs if adder.running_batch is not None else []
    adder.zipage_growths = RUNTIME.running_growths(running)  # this pass's, newcomers added
    adder.rem_total_token_offset += RUNTIME.admission_reserve(adder.zipage_growths)


def admit_by_peak(original, adder, req, *args, **kwargs):
    """SGLang charges a new request its prompt, a page and min(max_new_tokens, the module's
    CLIP_MAX_NEW_TOKENS), read when it runs: while it considers this request, that is what
    the request adds to the booked peak (admission.py), so that much and no more is charged.
    SGLang's ignore_eos path without a radix tree keeps its own rule."""
    growths = getattr(adder, "zipage_growths", None)
    if growths is None or (req.sampling_params.ignore_eos
                           and getattr(adder.tree_cache, "disable", True)):
        return original(adder, req, *args, **kwargs)
    from sglang.srt.managers import schedule_policy

    saved = schedule_policy.CLIP_MAX_NEW_TOKENS
    schedule_policy.CLIP_MAX_NEW_TOKENS = RUNTIME.new_request_charge(growths, req)
    try:
        result = original(adder, req, *args, **kwargs)
    finally:
        schedule_policy.CLIP_MAX_NEW_TOKENS = saved
    if adder.can_run_list and adder.can_run_list[-1] is req and adder.new_chunked_req is not req:
        mine = RUNTIME.newcomer(req)  # admitted whole: its growth joins the pass's
        if mine is not None:
            growths.add(mine)
    return result


def count_shadow_slots(result, checker, *args, **kwargs):
    full, swa = result
    return full + RUNTIME.shadows.held, swa


def evict_for(batch, num_tokens):
    from sglang.srt.mem_cache.common import evict_from_tree_cache

    evict_from_tree_cache(batch.tree_cache, num_tokens)


def lift_pool_cap(original, scheduler, req):
    requested = req.sampling_params.max_new_tokens
    original(scheduler, req)
    problem = RUNTIME.request_problem(req) if req.to_finish is None else None
    if problem:  # SGLang answers an aborted new request with HTTP 400 and this message
        req.set_finish_with_abort(problem)
        return
    budget = RUNTIME.budget_of(req)
    if budget is None:
        return  # compression off for this request: SGLang's cap stands
    page = scheduler.page_size
    paged_input = -(-len(req.origin_input_ids) // page) * page
    if paged_input + budget.admission_reserve() + page < scheduler.max_total_num_tokens:
        # The footprint is bounded by the budget, so only the model's context length
        # (logical positions) bounds the output, not the KV pool.
        cap = scheduler.model_config.context_len - 1 - len(req.origin_input_ids) - 1
        limit = scheduler.max_new_tokens_limit
        want = requested if requested is not None else 1 << 30
        if limit is not None and limit > 0:
            want = min(want, limit)
        req.sampling_params.max_new_tokens = max(0, min(want, cap))


def release_window(pool, req):
    RUNTIME.on_release(req)


def reset_on_retract(result, req):
    RUNTIME.on_retract(req)


# ------------------------------------------- PD decode server (--disaggregation-mode decode)
def offload_physical(original, req, req_to_token_pool, allocator):
    """A decode server's retraction copies a request's KV to host and restores it later
    instead of re-prefilling: a compressed request's columns are its physical ones (SGLang
    copies its logical length), after the compactions planned for it; its state stays."""
    st = getattr(req, "zipage", None)
    if not RUNTIME.ready or st is None:
        return original(req, req_to_token_pool, allocator)
    RUNTIME.settle()
    # SGLang's count: all but the last token (with overlap, the step in flight writes the
    # last one's column; the resumed request writes it again), as columns
    cols = req_to_token_pool.req_to_token[req.req_pool_idx, :st.physical(req.seqlen - 1)]
    req.kv_cache_cpu = allocator.get_cpu_copy(cols, mamba_indices=req.mamba_pool_idx)
    st.offloaded_kv()


def load_physical(original, req, req_to_token_pool, allocator):
    """The copy back, into the columns the preallocation gave it (``physical_fill_len``)."""
    st = getattr(req, "zipage", None)
    if not RUNTIME.ready or st is None or not st.offloaded:
        return original(req, req_to_token_pool, allocator)
    cols = req_to_token_pool.req_to_token[req.req_pool_idx, :req.kv_committed_len]
    allocator.load_cpu_copy(req.kv_cache_cpu, cols, mamba_indices=req.mamba_pool_idx)
    del req.kv_cache_cpu


def physical_fill_len(original, req):
    """What the decode server preallocates for a request: a resumed one holds its columns,
    not its logical length."""
    n = original(req)
    st = getattr(req, "zipage", None)
    return st.physical(n) if RUNTIME.ready and st is not None and st.offloaded else n


def physical_prebuilt(result, batch):
    """The batch the decode server resumes requests with carries logical lengths: the
    resumed ones hold their columns."""
    if RUNTIME.ready and RUNTIME.reloaded(batch):
        batch.orig_seq_lens = batch.seq_lens.to(batch.orig_seq_lens.dtype)


def decode_reserve(original, queue, *args, **kwargs):
    """The decode server keeps SGLang's reserved decode tokens (512) free for each request
    it holds, whatever its growth: a compressing one grows at most to its limit before a
    compaction frees room, so the running ones are booked at their growth's peak where that
    is less (never more than SGLang's)."""
    reserved = original(queue, *args, **kwargs)
    if not RUNTIME.ready or not (queue.queue or queue.retracted_queue):
        return reserved  # (it decides nothing then: SGLang asks every scheduler iteration)
    return reserved - RUNTIME.decode_reserve_relief(queue.scheduler.running_batch.reqs,
                                                    queue.num_reserved_decode_tokens)


# A PD decode server's admission pass (pop_preallocated), while it runs: (the running
# requests' growth, SGLang's own output estimate). Written by decode_admission_pass only.
_DECODE_PASS = None


def decode_admission_pass(original, queue, *args, **kwargs):
    """SGLang's decode server admits a transferred request once its prompt (less the tree's
    match) + min(max_new_tokens, disaggregation.decode.CLIP_MAX_NEW_TOKEN) fits, the module's
    value read while it considers that request (L1059). For the pass, the running compressing
    requests' growth is booked once; each newcomer is charged what it adds to that peak
    (decode_newcomer_charge), as on a single server (admit_by_peak); in elastic mode the
    running requests first make room for the first one waiting, as before a single server's
    admission (room_for_waiting, which a decode server never runs). The slots it hands out
    are written by the KV transfer, outside the forward stream's order: compaction moves
    that read freed slots have run first."""
    global _DECODE_PASS
    if not RUNTIME.ready:
        return original(queue, *args, **kwargs)
    scheduler = queue.scheduler
    if RUNTIME.budget.elastic:  # (with none waiting too: pressure ends once nothing waits)
        waiting = [d.req for d in queue.queue if d.waiting_for_input]
        if RUNTIME.admit_pressure(waiting, scheduler.running_batch,
                                  scheduler.max_running_requests,
                                  scheduler.new_token_ratio_tracker.current,
                                  queue.num_reserved_decode_tokens):
            RUNTIME.settle()  # its moves now: the slots they free are handed out next
    if not queue.queue:
        return original(queue, *args, **kwargs)
    from sglang.srt.disaggregation import decode

    RUNTIME.await_moves()  # the slots it preallocates are written by the transfer engine
    stock = decode.CLIP_MAX_NEW_TOKEN
    _DECODE_PASS = (RUNTIME.admission.growths(scheduler.running_batch.reqs), stock)
    try:
        return original(queue, *args, **kwargs)
    finally:
        _DECODE_PASS = None
        decode.CLIP_MAX_NEW_TOKEN = stock


def decode_newcomer_charge(original, req):
    """The first thing the pass asks of each newcomer: from here until the next one, SGLang's
    output estimate is this request's charge (SGLang's own for one that does not compress)."""
    n = original(req)
    if _DECODE_PASS is not None:
        from sglang.srt.disaggregation import decode

        decode.CLIP_MAX_NEW_TOKEN = RUNTIME.new_request_charge(_DECODE_PASS[0], req)
    return n


def decode_single_request_room(original, queue, retractable_tokens=None):
    """SGLang keeps room for its largest running request to end alone, as if every other one
    were retracted (L1315): a compressing request's own need ends at its limit, and the
    requests hold their columns (runtime.single_request_room). Outside an admission pass, or
    where SGLang asks for none, its own."""
    if _DECODE_PASS is None or retractable_tokens is None:
        return decode_running_estimate(original, queue, retractable_tokens)
    return RUNTIME.single_request_room(queue.scheduler.running_batch.reqs)


def decode_running_estimate(original, queue, *args, **kwargs):
    """What the running requests may still need stays SGLang's estimate within the pass."""
    if _DECODE_PASS is None:
        return original(queue, *args, **kwargs)
    from sglang.srt.disaggregation import decode

    charge, decode.CLIP_MAX_NEW_TOKEN = decode.CLIP_MAX_NEW_TOKEN, _DECODE_PASS[1]
    try:
        return original(queue, *args, **kwargs)
    finally:
        decode.CLIP_MAX_NEW_TOKEN = charge


def physical_swa_eviction(original, batch, req, pre_len):
    # SGLang passes the logical length (req.seqlen - 1); the columns are physical.
    return original(batch, req, RUNTIME.physical_len(req, pre_len) if RUNTIME.ready else pre_len)


def outputs_stay_private(original, req, tree_cache, **kwargs):
    """A retracted request re-prefills prompt + output. Inserted into the tree, the output
    would be shared, so never compressible: each retraction would grow the request's
    footprint past its budget. Its output KV stays its own; like SGLang's own
    cache_unfinished_req, the next chunk starts from all KV written so far."""
    n = len(req.get_fill_ids())
    if not (RUNTIME.ready and RUNTIME.keeps_outputs_private(req, n)):
        return original(req, tree_cache, **kwargs)
    import torch

    req.prefix_indices = tree_cache.req_to_token_pool.req_to_token[
        req.req_pool_idx, :RUNTIME.physical_len(req, n)].to(dtype=torch.int64, copy=True)


def report_state(result, scheduler, *args, **kwargs):
    running = scheduler.running_batch.reqs if scheduler.running_batch is not None else []
    report = RUNTIME.report(running)
    # The ranks that run the same requests: all TP ranks, or with DP attention the ranks of
    # this attention-TP group. Each of them handles this control request: gather what each did.
    tp = scheduler.attn_tp_group
    if tp.world_size > 1:
        from sglang_zipage import decisions

        report.update(decisions.across_ranks(RUNTIME.decisions.summary(), tp.cpu_group))
    result.internal_state["zipage"] = report
    return result


def decode_log_parts(result, observer, *args, **kwargs):
    return result + RUNTIME.log_parts()


def attach_meta_info(result, req, *args, **kwargs):
    from sglang_zipage import meta_info

    meta_info.attach(req)


def is_compressed(req) -> bool:
    st = getattr(req, "zipage", None)
    return st is not None and st.compactions > 0
