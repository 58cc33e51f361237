"""Zipage inside one SGLang scheduler process: the front the hooks (hooks.py) call.

It sets the parts up once the KV pool exists (``attach``) and hands every call to the part
that owns the job:
  memory.py       the buffers' share of the KV pool, planned before the pool is allocated
  kv_layout       how the pool holds a token (what the window stores, what scoring reads)
  query_window.py the last W decode queries of the requests near a compaction, or
  query_stats.py  the calibrated scorer's queries (query_capture.py: a calibration run's)
  policy.py       each request's budget and its decision at a decode step
  planner.py      the plans of a decode step (fixed, elastic, pressure; room.py on demand)
  admission.py    what SGLang's admission sets aside for the running requests
  executor.py     running the planned compactions before the next forward
  shadows.py      the asynchronous compactions' lifecycle (--zipage-async)
  counters.py     what is counted (/server_info, Prometheus); decisions.py the TP digest
Duck-types SGLang objects (ScheduleBatch, Req, ModelRunner) and never imports sglang.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from sglang_zipage import kv_layout, memory, query_capture, request_state, scorer, speculative
from sglang_zipage.admission import Admission
from sglang_zipage.budget import Budget, Budgets, floor_page
from sglang_zipage.config import ZipageConfig
from sglang_zipage.counters import Counters
from sglang_zipage.decisions import DecisionLog
from sglang_zipage.executor import Executor
from sglang_zipage.own_prompt import OwnPrompt
from sglang_zipage.planner import MAX_REQS_PER_LAUNCH, QUERY_SCRATCH_BYTES, Planner
from sglang_zipage.policy import RequestBudgets, StepPolicy
from sglang_zipage.query_capture import QueryCapture
from sglang_zipage.query_stats import QueryStats
from sglang_zipage.repetition import LoopGuard
from sglang_zipage.scoring import ScoringParams
from sglang_zipage.segments import Segments
from sglang_zipage.server_args import decode_graph_max_bs
from sglang_zipage.shadows import ShadowCompactions

logger = logging.getLogger("sglang_zipage")

SHADOW_BUDGETS = 8  # asynchronous mode: compactions in flight at once (fresh-slot reserve)


class ZipageRuntime:
    def __init__(self, config: ZipageConfig, evict=None, stock_clip: int = 4096):
        self.config = config
        self.evict = evict  # evict(batch, n): make n slots free from the radix tree (hooks)
        self.stock_clip = stock_clip  # SGLang's output estimate (CLIP_MAX_NEW_TOKENS)
        self.params = ScoringParams.from_config(config)
        self.stats = Counters()  # /server_info and, with --enable-metrics, Prometheus
        self.decisions = DecisionLog()  # identical on every tensor-parallel rank
        self.shadows = ShadowCompactions(0, torch.device("cpu"))  # --zipage-async (attach)
        self.memory_plan: Optional[memory.MemoryPlan] = None
        self.query_stats: Optional[QueryStats] = None  # the calibrated scorer's (scorer.py)
        self.calibration: Optional[QueryCapture] = None  # a calibration run's (attach)
        self.kv_memory_bytes: Optional[int] = None  # what SGLang sizes the pool from
        self.layout = self.window = self.planner = self.executor = None  # set by attach
        self.budgets = self.admission = None  # set by attach
        self.memory_bytes, self.warm_up_s = 0, None

    # ------------------------------------------------------------ setup
    def stats_queries(self, model_path: str) -> int:
        """The calibrated scorer's queries per head (its statistics, loaded once), or 0."""
        if self.query_stats is None:
            self.query_stats = scorer.load_stats(self.config, model_path)
        return self.query_stats.centroids.shape[2] if self.query_stats is not None else 0

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
        """Allocate the buffers once the KV pool exists (before CUDA-graph capture), as the
        memory plan sized them, and set the parts up."""
        allocator = model_runner.token_to_kv_pool_allocator
        page = allocator.page_size
        cfg = self.config.validate(page_size=page)
        self.layout = kv_layout.detect(model_runner, cfg.kv_budget,
                                       async_compaction=cfg.async_compaction,
                                       min_kv_budget=cfg.min_kv_budget)
        if query_capture.requested():  # a calibration run (calibrate.py)
            self.calibration = QueryCapture(self.layout, model_runner.model,
                                            *query_capture.requested(), model_runner.ps.attn_tp_rank)
        budgets = self.budgets = RequestBudgets(Budgets(
            Budget.from_config(cfg, page), self.layout.least_kv_budget, cfg.min_kv_budget))
        self.admission = Admission(budgets.booked, self.stock_clip,
                                   speculative.reserve(model_runner.server_args),
                                   speculative.tokens_per_step(model_runner.server_args))
        kv = self.layout.kv
        keys = kv.keys[0]
        device = self.device = keys.device
        query = self.layout.query
        self.ring_rows = self.layout.ring_rows()
        layers, kv_heads = len(kv.keys), keys.shape[1]
        shapes = memory.BufferShapes(layers, kv_heads, query.heads, query.width,
                                     model_runner.dtype.itemsize, cfg.decay > 0,
                                     self.stats_queries(model_runner.server_args.model_path))
        plan = self.memory_plan
        if plan is None or shapes != self.buffer_shapes:
            raise RuntimeError(f"sglang-zipage: the KV pool was sized without zipage's "
                               f"buffers ({shapes} vs {getattr(self, 'buffer_shapes', None)})")
        self.stats.graph_max_bs = decode_graph_max_bs(model_runner.server_args, device)
        window, calibrated = scorer.build(cfg, model_runner, self.layout, self.query_stats,
                                          plan.window_slots)
        if calibrated is not None:  # the forward stores no query
            self.ring_rows = [-1] * len(self.ring_rows)
        score_buffer = None
        if cfg.decay > 0:
            score_buffer = torch.zeros((layers, keys.shape[0], kv_heads), dtype=torch.float32,
                                       device=device)
        self.memory_bytes = (window.nbytes + (calibrated.nbytes if calibrated else 0)
                             + (score_buffer.numel() * 4 if score_buffer is not None else 0))
        if self.memory_bytes > plan.zipage_bytes:  # M1 holds by construction; say if not
            logger.warning("zipage: buffers take %d bytes, %d more than planned",
                           self.memory_bytes, self.memory_bytes - plan.zipage_bytes)
        if cfg.async_compaction:
            # Fresh slots for shadows in flight, set aside from admission (shadow_reserve).
            n = max(1, min(SHADOW_BUDGETS, model_runner.max_total_num_tokens // (16 * cfg.kv_budget)))
            self.shadows = ShadowCompactions(n * cfg.kv_budget, device)
        pending = []  # compaction plans and prompt copies: the planner's, for the executor

        def alloc(batch, n: int):
            """n slots from the pool, evicting unused radix-tree pages first as SGLang does."""
            if self.evict is not None:
                self.evict(batch, n)
            return allocator.alloc(n)

        own_prompt = (OwnPrompt(alloc, pending, self.stats) if cfg.compress_prompt
                      and self._spans_anywhere("--zipage-compress-prompt") else None)
        segments = (Segments(cfg.answer_budget) if cfg.think_end != "none"
                    and self._spans_anywhere("the thinking segment (the answer's protection)")
                    else None)
        policy = StepPolicy(budgets, window, self.stats, own_prompt=own_prompt,
                            loop_guard=LoopGuard() if cfg.loop_guard else None,
                            segments=segments, page_size=page)
        self.planner = Planner(
            budgets, policy, layout=self.layout, window=window, shadows=self.shadows,
            allocator=allocator, stats=self.stats, decisions=self.decisions, pending=pending,
            admission=self.admission, alloc=alloc,
            # elastic mode: once room is short, compact until this much more is free
            headroom=max(page, model_runner.max_total_num_tokens // 32 // page * page),
            # scoring gathers a launch's window rows at once: at most QUERY_SCRATCH_BYTES
            launch_cap=max(1, min(MAX_REQS_PER_LAUNCH, QUERY_SCRATCH_BYTES
                                  // max(1, shapes.launch_query_bytes(cfg.window)))))
        self.executor = Executor(self.params, kv, window, score_buffer, query.scale,
                                 pending, self.shadows, self.stats, device, calibrated)
        t0 = time.perf_counter()
        if device.type == "cuda":
            self.executor.warm_up(page, copies=own_prompt is not None)
        self.warm_up_s = round(time.perf_counter() - t0, 2)
        # SGLang's rule for its own series: one scheduler per attention-TP group reports
        # (tensor-parallel ranks take the same decisions; their counts would add up)
        if model_runner.server_args.enable_metrics and model_runner.ps.attn_tp_rank == 0:
            self.stats.export_metrics()
        self.window = window  # ready from here on
        logger.info("zipage: %s layout %s; budget %d + buffer %d tokens, window %d, page %d; "
                    "kernels warmed up in %.1f s", self.layout.name, self.layout.describe(),
                    cfg.kv_budget, cfg.buffer, cfg.window, page, self.warm_up_s)
        logger.info(plan.log_line())

    def follow(self, model_runner) -> None:
        """A speculative draft's KV pool: it holds the draft's KV at the target's slots
        (SGLang shares req_to_token and the allocator), so every compaction moves the same
        tokens in it (scoring.consensus), on the same stream, in the same launch."""
        layout = kv_layout.detect(model_runner, self.config.kv_budget)
        self.executor.follow(layout.kv)
        logger.info("zipage: the draft's %s pool %s follows the target's compactions",
                    layout.name, layout.describe())
        note = speculative.running_cap_note(model_runner.server_args.max_running_requests,
                                            model_runner.max_total_num_tokens, self.config)
        if note:
            logger.warning("zipage: %s", note)

    def _spans_anywhere(self, feature: str) -> bool:
        """Think segments and --zipage-compress-prompt need a layout whose compressed span
        may lie anywhere in a request, which a hybrid sliding-window pool's is not (said
        once at startup)."""
        if not self.layout.spans_anywhere:
            logger.warning("zipage: %s is off on %s's hybrid sliding-window pool (pass "
                           "--disable-hybrid-swa-memory)", feature, self.layout.name)
        return self.layout.spans_anywhere

    @property
    def ready(self) -> bool:
        return self.window is not None

    @property
    def budget(self) -> Optional[Budget]:
        """The server's budget (None before attach)."""
        return self.budgets.server if self.budgets else None

    # ------------------------------------------------------ per request
    def budget_of(self, req) -> Optional[Budget]:
        return self.budgets.budget_of(req)

    def request_problem(self, req) -> Optional[str]:
        """Why this request's own budget cannot be served (HTTP 400), or None."""
        return self.budgets.problem(req) if self.budgets else None

    def running_reserve(self, req) -> Optional[int]:
        """SGLang's per-request estimate: 0 for a compressing request (its growth is in
        ``admission_reserve``), None where SGLang's own estimate applies."""
        return None if self.admission.compresses(req) is None else 0

    def stock_reserve(self, req) -> int:
        return self.admission.stock_reserve(req)

    def running_growths(self, running_reqs):
        """The running compressing requests' growth (budget A1), for one admission pass."""
        return self.admission.growths(running_reqs)

    def admission_reserve(self, growths) -> int:
        """Tokens admission sets aside beside SGLang's per-request estimates: the running
        compressing requests' growth at its peak (budget A1) and, with --zipage-async, the
        fresh slots of compactions not yet in flight."""
        return growths.peak() + self.shadows.reserve()

    def single_request_room(self, running_reqs) -> int:
        """A PD decode server's room for its largest running request to end alone
        (admission.Admission.single_request_room)."""
        return self.admission.single_request_room([r for r in running_reqs if not r.finished()])

    def new_request_charge(self, growths, req) -> int:
        """SGLang's output estimate for a waiting request (CLIP_MAX_NEW_TOKENS while SGLang
        considers it): what it adds to the peak of ``growths``, or SGLang's own clip."""
        extra = self.admission.marginal(growths, req)
        return self.stock_clip if extra is None else extra

    def newcomer(self, req):
        return self.admission.newcomer(req)

    def on_release(self, req) -> None:
        """The request gives back its req_pool_idx (finish, abort or retraction)."""
        if self.window is not None and req.req_pool_idx is not None:
            self.window.release(req.req_pool_idx)
        st = getattr(req, "zipage", None)
        if st is not None and st.shadow is not None:
            self.shadows.drop(st.ended_shadow(), self.planner.allocator)

    def on_retract(self, req) -> None:
        request_state.restart(req)

    def decode_reserve_relief(self, running, per_request: int) -> int:
        """A PD decode server reserves ``per_request`` tokens for every request it holds;
        its running compressing requests are booked at the peak of their growth (A1) where
        that is less: the tokens that frees for admission."""
        compressing = [r for r in running
                       if not r.finished() and self.admission.compresses(r) is not None]
        stock = len(compressing) * per_request
        return stock - min(stock, self.admission.growths(compressing).peak())

    def reloaded(self, batch) -> bool:
        """A PD decode server resumed requests from host: their lengths in ``batch`` are the
        columns they hold. True if any was."""
        updates = request_state.reloaded_lengths(batch)
        if updates:
            request_state.set_lengths(batch, updates)
        return bool(updates)

    def settle(self) -> None:
        """The compaction moves planned so far, now, after the forward in flight: a PD
        decode server's retraction copies the columns they move."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.flush()

    def await_moves(self) -> None:
        """Before a PD decode server hands free slots to its KV transfers (executor)."""
        self.executor.await_landed()

    def physical_len(self, req, logical: int) -> int:
        return request_state.physical_len(req, logical)

    def keeps_outputs_private(self, req, filled: int) -> bool:
        """Columns the request owns stay out of the radix tree: a re-prefill's output (after
        retraction; only the request's own columns can be compressed), and a prompt it copied
        (own_prompt.py) before its last chunk's result came to be cached (overlap)."""
        if self.budget_of(req) is None:
            return False
        st = getattr(req, "zipage", None)
        copied = (st is not None and st.c0 is not None
                  and st.c0 < floor_page(filled, self.budget.page_size))
        return filled > len(req.origin_input_ids) or copied

    # ------------------------------------------------------- decode step
    def before_decode(self, batch) -> None:
        """Plan compactions (planner.py); runs before SGLang's decode memory check."""
        self.planner.step(batch)

    def admit_pressure(self, waiting, running, max_running: int, ratio: float,
                       reserve: int = 0) -> int:
        return self.planner.admit(waiting, running, max_running, ratio, reserve)

    def flush(self) -> None:
        """Before a forward, on its stream (executor.py)."""
        if self.ready:
            self.executor.flush()

    # ----------------------------------------------------------- forward
    def position_offsets(self, batch) -> Optional[torch.Tensor]:
        """[bs] int64 logical - physical offsets of a batch's requests, or None if all 0
        (I5)."""
        offs = [getattr(r, "zipage", None) for r in batch.reqs]
        offs = [st.pos_offset if st is not None else 0 for st in offs]
        if not any(offs):
            return None
        t = torch.tensor(offs, dtype=torch.int64)
        if self.device.type == "cuda":
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def unpublished(self, batch) -> Optional[torch.Tensor]:
        """[bs] int64 (CPU): the columns each request of ``batch`` evicted since the device
        last published its length, now read (ReqState.published); None if none did."""
        states = [getattr(r, "zipage", None) for r in batch.reqs]
        evicted = [st.published() if st is not None else 0 for st in states]
        return torch.tensor(evicted, dtype=torch.int64) if any(evicted) else None

    def capture(self, layer_id: int, q: torch.Tensor, q_rope, forward_batch) -> None:
        """Keep a decode step's queries of a scored layer (the layout says which layers,
        and what the layer's query arguments mean)."""
        row = self.ring_rows[layer_id]
        if row >= 0:
            self.window.write(row, self.layout.queries(layer_id, q, q_rope),
                              forward_batch.req_pool_indices, forward_batch.positions)

    def stash_query(self, layer_id: int, q_nope) -> None:
        """MLA: the model split its query before absorbing it (kv_layout.MLALayout.stash)."""
        if self.ready:
            self.layout.stash(layer_id, q_nope)

    def log_parts(self):
        """Appended to SGLang's periodic decode log line."""
        running = self.planner.compressed_running if self.planner else 0
        return [f"zipage compressed-req: {running}", f"compactions: {self.stats['compactions']}"]

    # ------------------------------------------------------------ report
    def report(self, running_reqs=()) -> dict:
        """/server_info's zipage state (counters.server_info)."""
        from sglang_zipage.counters import server_info

        return server_info(self, running_reqs)
