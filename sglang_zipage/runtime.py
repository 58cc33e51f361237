"""Zipage's state inside one SGLang scheduler process, and the steps the hooks call.

The hooks (hooks.py) stay thin: each reads SGLang objects, calls one method here, and
writes the result back. This module owns the per-process buffers (query window, global
scores), the planner (at the limit in fixed mode, on demand in elastic mode), the queue of
planned compactions and kernel launches. The asynchronous lifecycle lives in shadows.py,
the KV layouts in kv_layout.py, what is counted (/server_info, Prometheus) in counters.py.
It duck-types SGLang objects (ScheduleBatch, Req, ModelRunner) and never imports sglang.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import List, Optional

import torch

from sglang_zipage import kv_layout, memory, request_budget
from sglang_zipage.budget import Budget, Pressure, ReqState, async_lag
from sglang_zipage.compaction import (S_MAX_ALIGN, CompactionItem, CompactionPlan, execute,
                                     plan_compaction)
from sglang_zipage.config import ZipageConfig
from sglang_zipage.counters import Counters
from sglang_zipage.decisions import DecisionLog
from sglang_zipage.query_window import QueryWindow
from sglang_zipage.scoring import ScoringParams
from sglang_zipage.shadows import ShadowCompactions, ShadowLaunch

logger = logging.getLogger("sglang_zipage")

MAX_REQS_PER_LAUNCH = 32  # bounds the scoring scratch ([L, R, Hkv, S] fp32) ...
QUERY_SCRATCH_BYTES = 512 << 20  # ... the window rows a launch gathers ...
SCRATCH_LIMITS = 32  # ... and R * S <= this many budget limits (elastic suffixes are long)
SHADOW_BUDGETS = 8  # asynchronous mode: compactions in flight at once (fresh-slot reserve)


class ZipageRuntime:
    def __init__(self, config: ZipageConfig, evict=None, stock_clip: int = 4096):
        self.config = config
        self.stock_clip = stock_clip  # SGLang's output estimate (CLIP_MAX_NEW_TOKENS)
        self.evict = evict  # evict(batch, n): make n slots free from the radix tree (hooks)
        self.params = ScoringParams(
            window=config.window, decay=config.decay, redundancy=config.redundancy,
            redundancy_lambda=config.redundancy_lambda, redundancy_tau=config.redundancy_tau,
            pooling=config.pooling, sink=config.sink, selection=config.selection)
        self.budget: Optional[Budget] = None
        self.layout: Optional[kv_layout.KVLayout] = None  # set by attach
        self.window: Optional[QueryWindow] = None
        self.pending: List[CompactionPlan] = []
        self.shadows = ShadowCompactions(0, torch.device("cpu"))  # --zipage-async (attach)
        self._budgets = {}  # per-request kv_budget -> Budget
        self.compressed_running = 0
        self.pressure = Pressure()  # elastic mode: room or pressure (budget.py)
        self.waiting = 0  # requests the pool, not the running cap, keeps waiting (elastic)
        self.stats = Counters()  # /server_info and, with --enable-metrics, Prometheus
        self.decisions = DecisionLog()  # identical on every tensor-parallel rank
        self.steps = 0  # decode steps planned

    # ------------------------------------------------------------ setup
    def plan_memory(self, shapes, *, stock_pool_tokens: int, cell_bytes: int,
                    available_bytes: int, max_running: int, page: int, model: str):
        """Before SGLang allocates the pool: size the window and the global scores inside
        the pool's share (memory.py) and return the plan, whose pool_tokens SGLang then
        allocates. Raises memory.NoRoom when the share cannot hold them."""
        cfg = self.config
        self.buffer_shapes = shapes
        self.memory_plan = memory.plan(
            shapes, stock_pool_tokens=stock_pool_tokens, cell_bytes=cell_bytes,
            available_bytes=available_bytes, max_running=max_running,
            limit=cfg.kv_budget + cfg.buffer, window=cfg.window, page=page,
            share=cfg.memory_fraction, model=model)
        return self.memory_plan

    def attach(self, model_runner) -> None:
        """Allocate buffers once the KV pool exists (before CUDA-graph capture), as the
        memory plan sized them."""
        allocator = model_runner.token_to_kv_pool_allocator
        page = allocator.page_size
        cfg = self.config.validate(page_size=page)
        self.layout = kv_layout.detect(model_runner, cfg.kv_budget,
                                       async_compaction=cfg.async_compaction)
        lag = async_lag(page) if cfg.async_compaction else 0
        self.budget = Budget(cfg.kv_budget, cfg.buffer, cfg.window, page, lag,
                             elastic=cfg.mode == "elastic")
        # Elastic mode: once room is short, compact until this much more is free (hysteresis).
        self.headroom = max(page, model_runner.max_total_num_tokens // 32 // page * page)
        self.page_size = page
        self.allocator = allocator
        self.kv = self.layout.kv
        keys = self.kv.keys[0]
        self.device = keys.device
        query = self.layout.query
        self.sm_scale = query.scale
        self.ring_rows = self.layout.ring_rows()
        layers, kv_heads = len(self.kv.keys), keys.shape[1]
        shapes = memory.BufferShapes(layers, kv_heads, query.heads, query.width,
                                     model_runner.dtype.itemsize, cfg.decay > 0)
        plan = getattr(self, "memory_plan", None)
        if plan is None or shapes != self.buffer_shapes:
            raise RuntimeError(f"sglang-zipage: the KV pool was sized without zipage's "
                               f"buffers ({shapes} vs {getattr(self, 'buffer_shapes', None)})")
        rows = model_runner.req_to_token_pool.req_to_token.shape[0]
        self.window = QueryWindow(layers, plan.window_slots, rows, cfg.window, query.heads,
                                  query.width, model_runner.dtype, self.device)
        # Scoring gathers a launch's window rows at once: at most QUERY_SCRATCH_BYTES of them.
        self.launch_cap = max(1, min(MAX_REQS_PER_LAUNCH, QUERY_SCRATCH_BYTES // plan.slot_bytes))
        self.score_buffer = None
        if cfg.decay > 0:
            self.score_buffer = torch.zeros((layers, keys.shape[0], kv_heads),
                                            dtype=torch.float32, device=self.device)
        self.memory_bytes = self.window.nbytes + (self.score_buffer.numel() * 4
                                                  if self.score_buffer is not None else 0)
        if self.memory_bytes > plan.zipage_bytes:  # M1 holds by construction; say if not
            logger.warning("zipage: buffers take %d bytes, %d more than planned",
                           self.memory_bytes, self.memory_bytes - plan.zipage_bytes)
        if cfg.async_compaction:
            # Fresh slots for shadows in flight, set aside from admission (shadow_reserve).
            n = max(1, min(SHADOW_BUDGETS, model_runner.max_total_num_tokens // (16 * cfg.kv_budget)))
            self.shadows = ShadowCompactions(n * cfg.kv_budget, self.device)
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            self._warm_up()
        self.warm_up_s = round(time.perf_counter() - t0, 2)
        # SGLang's rule for its own series: one scheduler per attention-TP group reports
        # (tensor-parallel ranks take the same decisions; their counts would add up)
        if model_runner.server_args.enable_metrics and model_runner.ps.attn_tp_rank == 0:
            self.stats.export_metrics()
        logger.info("zipage: %s layout %s; budget %d + buffer %d tokens, window %d, page %d; "
                    "kernels warmed up in %.1f s", self.layout.name, self.layout.describe(),
                    cfg.kv_budget, cfg.buffer, cfg.window, page, self.warm_up_s)
        logger.info(plan.log_line())

    def _warm_up(self) -> None:
        """Compile the Triton kernels now, not in the middle of the first compaction
        (seconds of JIT with every running request waiting): one compaction on scratch
        buffers shaped like the pool's. The kernels compile one variant for any batch
        (kernels.utils.lazy_jit's batch_args, plans padded to S_MAX_ALIGN columns)."""
        k, s = 2 * self.page_size, max(4 * self.page_size, 2 * S_MAX_ALIGN)
        like = lambda bufs: [torch.zeros((s + 1, *bufs[0].shape[1:]), dtype=bufs[0].dtype,
                                         device=self.device)] * len(bufs) if bufs else bufs
        kv = self.kv
        scratch = dataclasses.replace(kv, keys=like(kv.keys), values=like(kv.values),
                                      recent_keys=like(kv.recent_keys),
                                      recent_values=like(kv.recent_values))
        scores = [torch.zeros((s + 1, kv.keys[0].shape[1]), device=self.device)] * len(kv.keys)
        slots = torch.arange(1, s + 1, device=self.device)[None]
        plan = CompactionPlan(
            k=k, req_pool_indices=[0], window_slots=torch.zeros(1, dtype=torch.int64, device=self.device),
            src_slots=slots, src_lens=torch.tensor([s], device=self.device), dst_slots=slots[:, :k],
            n_stored=torch.tensor([k], device=self.device),
            first=torch.tensor([True], device=self.device))
        execute(plan, self.params, self.window.gather(plan.window_slots), scratch,
                scores if self.score_buffer is not None else None, self.sm_scale)
        torch.cuda.synchronize()

    @property
    def ready(self) -> bool:
        return self.window is not None

    # ------------------------------------------------------ per request
    def _c0(self, req) -> int:
        return self.budget.compress_start(req.cache_protected_len, len(req.origin_input_ids))

    def state(self, req) -> ReqState:
        st = getattr(req, "zipage", None)
        if st is None:
            st = req.zipage = ReqState(c0=self._c0(req))
        elif st.c0 is None:
            st.c0 = self._c0(req)
        return st

    def suffix_len(self, req) -> int:
        st = getattr(req, "zipage", None)
        c0 = st.c0 if st is not None and st.c0 is not None else self._c0(req)
        return max(0, req.kv_committed_len - c0)

    def budget_of(self, req) -> Optional[Budget]:
        """The request's budget: its own zipage_kv_budget, the server's, or None (off). An
        own budget below the model's sliding window is raised to it (page aligned): the
        sliding-window layers need that many tokens kept (kv_layout.KVLayout.min_kv_budget)."""
        own = request_budget.of(req)
        if own is None:
            return self.budget
        if own == 0:
            return None
        page = self.page_size
        own = max(own, -(-self.layout.min_kv_budget // page) * page)
        if own not in self._budgets:
            self._budgets[own] = dataclasses.replace(self.budget, kv_budget=own)
        return self._budgets[own]

    def running_reserve(self, req) -> Optional[int]:
        """Tokens a running request may still add; None when it never compresses."""
        budget = self.budget_of(req)
        if budget is None:
            return None
        remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
        return budget.reserve(self.suffix_len(req), remaining)

    def stock_reserve(self, req) -> int:
        """SGLang's own estimate of what a request that never compresses may still add."""
        return min(req.sampling_params.max_new_tokens - len(req.output_ids), self.stock_clip)

    def admission_view(self, req) -> int:
        """What admission sets aside for a running request (before SGLang's new-token ratio)."""
        own = self.running_reserve(req)
        return self.stock_reserve(req) if own is None else own

    def on_release(self, req) -> None:
        """The request gives back its req_pool_idx (finish, abort or retraction)."""
        if self.window is not None and req.req_pool_idx is not None:
            self.window.release(req.req_pool_idx)
        st = getattr(req, "zipage", None)
        if st is not None and st.shadow is not None:
            self.shadows.drop(st.shadow, self.allocator)
            st.shadow = None

    def shadow_reserve(self) -> int:
        """Tokens admission leaves free for shadows not yet in flight."""
        return self.shadows.reserve()

    def on_retract(self, req) -> None:
        """After retraction the request re-prefills its tokens; its suffix starts over."""
        st = getattr(req, "zipage", None)
        if st is not None:
            # c0 is recomputed at its next decode step, from the prefix it re-matched.
            req.zipage = ReqState(c0=None, compactions=st.compactions,
                                  pressure_compactions=st.pressure_compactions)

    def physical_len(self, req, logical: int) -> int:
        """A logical length of the request (position count) as a column count (I5)."""
        st = getattr(req, "zipage", None)
        return st.physical(logical) if st is not None else logical

    def keeps_outputs_private(self, req, filled: int) -> bool:
        """A re-prefill that reaches past the prompt (after retraction) keeps its output KV
        out of the radix tree: only the request's own columns can be compressed."""
        return filled > len(req.origin_input_ids) and self.budget_of(req) is not None

    # ------------------------------------------------------- decode step
    def before_decode(self, batch) -> None:
        """Plan compactions for requests whose suffix reached the limit; free their pages.

        Runs in the scheduler before the decode memory check, so the freed pages count.
        """
        self.steps += 1
        items, rows, compressed, commits, shadows = [], [], 0, [], []
        room = self.shadows.reserve()
        pressed = self.budget.elastic and self.pressure.on and self.pressure.settle(
            self._room(batch), self._demand(batch), self.waiting)
        for i, req in enumerate(batch.reqs):
            budget = self.budget_of(req) if not req.finished() else None
            if budget is None or req.req_pool_idx is None:
                continue
            st = self.state(req)
            compressed += st.compactions > 0
            suffix = req.kv_committed_len - st.c0
            st.max_suffix = max(st.max_suffix, suffix)
            self.stats.suffix(suffix)
            if st.shadow is not None:  # in flight: commit at the limit. Never earlier on a
                # GPU-timing probe: tensor-parallel ranks must take the same step everywhere.
                if suffix >= budget.limit:
                    commits.append((i, suffix))
                continue
            if budget.wants_window(st, suffix):
                if self.window.assign(req.req_pool_idx):
                    st.window_since = req.decode_batch_idx
                else:
                    self.stats.add("window_slot_misses")
            if budget.needs_compaction(st, suffix, req.decode_batch_idx, pressed):
                item = self._item(req, st, suffix, budget)
                if budget.lag and suffix < budget.limit:
                    if room >= item.kv_budget:  # else it retries at its next step
                        shadows.append((req, item))
                        room -= item.kv_budget
                else:
                    self.stats.add("async_fallbacks", budget.lag > 0)
                    items.append(item)
                    rows.append(i)
        self.compressed_running = compressed
        self.stats.step(len(batch.reqs), compressed)
        updates = [self._commit(batch, i, suffix) for i, suffix in commits]
        if shadows:
            self._plan_shadows(batch, shadows)
        if items:
            updates += self._plan(batch, items, rows)
            if pressed:  # compressing at the limit is what pressure means in elastic mode
                self._count_pressure(batch, rows)
        if updates:
            self._set_lengths(batch, updates)
        if self.budget.elastic:  # this step writes up to one page per request
            short = len(batch.reqs) * self.page_size - self._room(batch)
            if short > 0:
                self.pressure.ran_short()
                self.make_room(batch, short + self.headroom)

    def _item(self, req, st, suffix: int, budget: Budget) -> CompactionItem:
        """A compaction of the request's suffix down to its budget: scored with its window,
        or windowless when it holds no slot (budget W2)."""
        slot = self.window.slot_of(req.req_pool_idx) if st.window_since >= 0 else 0
        return CompactionItem(req.req_pool_idx, st.c0, suffix, st.n_stored,
                              st.n_stored == 0,  # first since (re)prefill
                              slot, budget.kv_budget)

    def _window_done(self, req) -> None:
        """Its compaction is planned (it read the window at plan time): the slot goes back for
        the requests nearing their limits, or, where its next window starts within W tokens,
        it keeps one and refills it from now (budget W1). A windowless one is counted."""
        st = req.zipage
        if st.window_since < 0:
            self.stats.windowless()
        budget = self.budget_of(req)
        if budget is not None and budget.keeps_window:
            st.window_since = (req.decode_batch_idx if self.window.assign(req.req_pool_idx)
                               else -1)
            return
        self.window.release(req.req_pool_idx)
        st.window_since = -1

    # ------------------------------------------------- elastic: room on demand
    def _room(self, batch) -> int:
        return self.allocator.available_size() + batch.tree_cache.evictable_size()

    @staticmethod
    def _demand(batch) -> int:
        """Tokens the running requests may still write at full KV."""
        return sum(max(0, r.sampling_params.max_new_tokens - len(r.output_ids))
                   for r in batch.reqs if not r.finished())

    def make_room(self, batch, tokens: int) -> int:
        """Elastic mode: compact over-budget requests of ``batch`` down to their budgets,
        largest yield first, until ``tokens`` slots are freed or none can yield. Returns
        the slots freed."""
        offers = []
        for i, req in enumerate(batch.reqs):
            budget = self.budget_of(req) if not req.finished() else None
            if budget is None or req.req_pool_idx is None:
                continue
            st = self.state(req)
            suffix = req.kv_committed_len - st.c0
            gain = budget.can_yield(st, suffix, req.decode_batch_idx)
            if gain > 0:
                offers.append((gain, i, self._item(req, st, suffix, budget)))
        offers.sort(key=lambda o: -o[0])
        freed, items, rows = 0, [], []
        for gain, i, item in offers:
            if freed >= tokens:
                break
            freed += gain
            items.append(item)
            rows.append(i)
        if items:
            self._count_pressure(batch, rows)
            self._set_lengths(batch, self._plan(batch, items, rows))
        return freed

    def _count_pressure(self, batch, rows) -> None:
        """Elastic mode: these compactions were the pool's pressure (meta_info, counters)."""
        for i in rows:
            batch.reqs[i].zipage.pressure_compactions += 1
        self.stats.pressure(len(rows))

    def admit_pressure(self, waiting, running, max_running: int) -> None:
        """Elastic mode, before admission: if the first waiting request does not fit
        beside what running requests reserve, running requests yield the difference (not
        when the running-request cap, not memory, is what keeps it waiting)."""
        capped = running is not None and len(running.reqs) >= max_running
        self.waiting = 0 if capped else len(waiting)
        if not waiting or running is None or not running.reqs or capped:
            return
        head = waiting[0]
        budget = self.budget_of(head)
        need = len(head.origin_input_ids) + (budget.admission_reserve() if budget
                                             else self.stock_reserve(head))
        reserved = sum(self.admission_view(r) for r in running.reqs if not r.finished())
        short = need + reserved - self._room(running)
        if short > 0:
            self.pressure.ran_short()
            self.make_room(running, short + self.headroom)

    def _plan_shadows(self, batch, shadows) -> None:
        """Plan asynchronous compactions into fresh slots, one launch per kept count."""
        r2t = batch.req_to_token_pool.req_to_token
        for k, windowless in sorted({(it.kv_budget, it.window_slot == 0) for _, it in shadows}):
            group = [(req, dataclasses.replace(it, suffix=it.suffix // self.page_size * self.page_size))
                     for req, it in shadows
                     if it.kv_budget == k and (it.window_slot == 0) == windowless]  # whole pages (I2)
            group = [(req, it) for req, it in group if it.suffix > k][:self.launch_cap]
            fresh = self.alloc(batch, k * len(group)) if group else None
            if fresh is None:
                continue  # no room now: they retry at their next step
            self.shadows.plan(r2t, group, k, self.page_size, fresh.view(len(group), k))
            free = self.allocator.available_size()
            for req, it in group:
                self.decisions.record(self.steps, req.rid, it.c0, it.suffix, k, free)
                req.skip_radix_cache_insert = True  # I4 from now on
                self._window_done(req)
            self.stats.add("async_compactions", len(group))
            self.stats.add("compaction_batches")

    def alloc(self, batch, n: int):
        """n slots from the pool, evicting unused radix-tree pages first as SGLang does."""
        if self.evict is not None:
            self.evict(batch, n)
        return self.allocator.alloc(n)

    def _commit(self, batch, i: int, suffix: int):
        """Swap a request onto its compacted fresh slots; free its old snapshot."""
        req = batch.reqs[i]
        k, evicted, awaited = self.shadows.commit(req, batch.req_to_token_pool.req_to_token,
                                                  suffix, self.allocator)
        self.stats.add("async_awaited", awaited)
        return self._compacted(req, i, k, evicted)

    def _plan(self, batch, items, rows):
        r2t = batch.req_to_token_pool.req_to_token
        allocator = batch.token_to_kv_pool_allocator
        req_of = {it.req_pool_idx: batch.reqs[i] for it, i in zip(items, rows)}
        # one launch group per kept count, windowless ones apart (compaction.execute)
        for k, windowless in sorted({(it.kv_budget, it.window_slot == 0) for it in items}):
            for chunk in self._launch_groups([it for it in items if it.kv_budget == k
                                              and (it.window_slot == 0) == windowless]):
                plan, surplus = plan_compaction(r2t, chunk, k, self.page_size)
                self.layout.remap_window(r2t, chunk, k, allocator,
                                         [req_of[it.req_pool_idx] for it in chunk])
                allocator.free(surplus)
                self.pending.append(plan)
                self.stats.add("compaction_batches")
        for i in rows:
            self._window_done(batch.reqs[i])
        return [self._compacted(batch.reqs[i], i, it.kv_budget, it.suffix - it.kv_budget)
                for it, i in zip(items, rows)]

    def _launch_groups(self, items):
        """Split into launches of at most ``launch_cap`` requests whose padded scratch
        (requests x longest suffix) stays within SCRATCH_LIMITS budget limits."""
        cap = SCRATCH_LIMITS * self.budget.limit
        group = []
        for it in sorted(items, key=lambda it: -it.suffix):
            if group and (len(group) == self.launch_cap or (len(group) + 1) * group[0].suffix > cap):
                yield group
                group = []
            group.append(it)
        if group:
            yield group

    def _compacted(self, req, i: int, k: int, evicted: int):
        """Book a finished compaction of ``evicted`` suffix tokens down to k kept."""
        st = req.zipage
        self.decisions.record(self.steps, req.rid, st.c0, k + evicted, k, self.allocator.available_size())
        st.pos_offset += evicted
        st.n_stored = k
        st.compactions += 1
        req.kv_committed_len -= evicted
        req.kv.kv_allocated_len -= evicted
        req.skip_radix_cache_insert = True  # I4
        self.stats.compacted(evicted, self.page_size)
        return i, req.kv_committed_len

    @staticmethod
    def _set_lengths(batch, updates) -> None:
        # New tensors, never in-place edits: an in-flight forward may hold the old ones.
        seq_lens_cpu = batch.seq_lens_cpu.clone()
        for i, new_len in updates:
            seq_lens_cpu[i] = new_len
        batch.seq_lens_cpu = seq_lens_cpu
        batch.seq_lens = seq_lens_cpu.to(batch.seq_lens.device, non_blocking=True)
        batch.seq_lens_sum = None

    def flush(self) -> None:
        """Before a forward, on its stream: window-table updates, in-place compactions
        (C2), shadow launches on the side stream, then waits for shadows committed early."""
        if self.window is None:
            return
        self.window.flush()
        if not (self.pending or self.shadows.busy):
            return
        t0 = time.perf_counter()
        stream = torch.cuda.current_stream() if self.device.type == "cuda" else None
        sbufs = list(self.score_buffer) if self.score_buffer is not None else None
        if self.pending:
            span = self.stats.span_start(stream)
            for plan in self.pending:
                self._execute(plan, self._queries(plan), sbufs, stream)
            self.pending.clear()
            self.stats.span_end(span, stream, t0)
        for launch in self.shadows.take_launches():
            self._launch(launch, sbufs, stream)
        self.shadows.wait_committed(stream)
        self.stats.launch_time(time.perf_counter() - t0)

    def _queries(self, plan):
        """The plan's window rows (a copy), or None for a windowless plan."""
        return None if plan.windowless else self.window.gather(plan.window_slots)

    def _execute(self, plan, q_window, sbufs, stream) -> None:
        if stream is not None:
            for t in (*plan.tensors, q_window):
                if t is not None:
                    t.record_stream(stream)
        execute(plan, self.params, q_window, self.kv, sbufs, self.sm_scale)

    def _launch(self, launch: ShadowLaunch, sbufs, forward_stream) -> None:
        """Start asynchronous compactions. The side stream waits for the forwards issued so
        far (they wrote the snapshots' last tokens and queries) and reads a copy of the
        window rows taken now (the next forwards overwrite the ring)."""
        plan = launch.plan
        q_window = self._queries(plan)  # a copy, on the forward stream
        if forward_stream is None:  # CPU: runs now, in order
            t0 = time.perf_counter()
            self._execute(plan, q_window, sbufs, None)
            self.stats.span_end(None, None, t0)
            launch.launched = True
            return
        side = self.shadows.side_stream
        side.wait_stream(forward_stream)
        with torch.cuda.stream(side):
            span = self.stats.span_start(side)
            self._execute(plan, q_window, sbufs, side)
            self.stats.span_end(span, side, 0.0)
            launch.done = torch.cuda.Event()
            launch.done.record(side)
        launch.launched = True

    # ----------------------------------------------------------- forward
    def position_offsets(self, batch) -> Optional[torch.Tensor]:
        """[bs] int64 logical - physical offsets of a decode batch, or None if all 0 (I5)."""
        offs = [getattr(r, "zipage", None) for r in batch.reqs]
        offs = [st.pos_offset if st is not None else 0 for st in offs]
        if not any(offs):
            return None
        t = torch.tensor(offs, dtype=torch.int64)
        if self.device.type == "cuda":
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def capture(self, layer_id: int, q: torch.Tensor, q_rope, forward_batch) -> None:
        """Keep a decode step's queries of a scored layer (the layout says which layers,
        and what the layer's query arguments mean)."""
        row = self.ring_rows[layer_id]
        if row >= 0:
            self.window.write(row, self.layout.queries(layer_id, q, q_rope),
                              forward_batch.req_pool_indices, forward_batch.positions)

    def stash_query(self, layer_id: int, q_nope) -> None:
        """MLA: the model split its query before absorbing it (kv_layout.MLALayout.stash)."""
        if self.ready and self.layout.name == "mla-compact":
            self.layout.stash(layer_id, q_nope)

    def log_parts(self):
        """Appended to SGLang's periodic decode log line."""
        return [f"zipage compressed-req: {self.compressed_running}",
                f"compactions: {self.stats['compactions']}"]

    # ------------------------------------------------------------ report
    def report(self, running_reqs=()) -> dict:
        compressed = sum(1 for r in running_reqs
                         if getattr(r, "zipage", None) is not None and r.zipage.compactions)
        return {"config": dataclasses.asdict(self.config), "active": self.ready,
                "layout": self.layout.describe() if self.ready else None,
                "budget_limit_tokens": self.budget.limit if self.budget else None,
                "memory_bytes": getattr(self, "memory_bytes", 0),
                "warm_up_s": getattr(self, "warm_up_s", None),
                "memory": (self.memory_plan.describe()
                           if getattr(self, "memory_plan", None) else None),
                "running_compressed_requests": compressed,
                "free_window_slots": self.window.free_slots if self.window else None,
                "window_slots": self.window.num_slots if self.window else None,
                "shadow_tokens_held": self.shadows.held, **self.stats.snapshot(),
                "elastic_pressure": self.pressure.on, "pressure_episodes": self.pressure.episodes,
                **self.decisions.summary()}
