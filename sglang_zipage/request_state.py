"""Zipage's per-request state, kept on SGLang's Req as ``req.zipage``.

Created at a request's first decode step (``state_of``), when its compressible suffix starts:
the columns [0, c0) are the prompt's full pages (radix-owned, never compressed), [c0, kv_len)
its decode suffix. A retraction starts it over (``restart``): the request re-prefills and its
c0 is found again; on a PD decode server its columns go to host and come back as they are,
and its state stays. The invariants it carries are budget.py's (I5: position = physical length
+ pos_offset). Its fields change only through its methods, one per event in a request's life
(a window slot taken or given back, a compaction, a squeeze, its prompt copied, its answer
found, a loop seen, an asynchronous compaction started or ended); the modules that decide
those events call them. Duck-types SGLang's Req and ScheduleBatch; imports nothing of sglang
or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class ReqState:
    c0: Optional[int]  # first compressible column (page aligned, >= the radix-owned
    # prefix); None until the request's next decode step after a (re-)prefill
    pos_offset: int = 0  # logical length - physical length (I5)
    compactions: int = 0
    pressure_compactions: int = 0  # elastic mode: those made on demand
    n_stored: int = 0  # leading suffix tokens whose global score is valid (kept last time)
    window_since: int = -1  # decode_batch_idx when the request got its window slot
    max_suffix: int = 0  # largest suffix seen at a decode step (I6 evidence)
    shadow: Any = None  # its asynchronous compaction in flight (shadows.Shadow), if any
    loop_boost: int = 1  # its budget's multiplier, raised by the loop guard (repetition.py)
    loop_guard: int = 0  # times the loop guard raised it
    loop_checked_at: int = 0  # output length at the guard's last check
    answer_col: Optional[int] = None  # first column of its answer (the think-end marker on):
    # never evicted; None while it thinks (or has no thinking segment to protect)
    think_scanned: int = 0  # output tokens searched for the think-end marker
    squeezed_to: Optional[int] = None  # its floor, its budget while squeezed (budget A3)
    answer_done: bool = False  # the thinking segment's last compaction is made (or not needed)
    prompt_asks: int = 2  # decode steps own_prompt.py may still ask it at, since its
    # (re-)prefill: its prompt may reach the tree a step late (0: its turn is over)
    offloaded: bool = False  # a PD decode server's retraction copied its columns to host as
    # they are: it resumes with this state (``offloaded_kv``, ``reloaded``), not re-prefilled
    unpublished: int = 0  # columns evicted since its length was last read from the device:
    # speculative decoding's overlap scheduler reads a step's lengths from what the step
    # before published, which counts them still (read and cleared by ``published``; read
    # only there: without speculative decoding the schedule's own lengths are published)

    def physical(self, logical: int) -> int:
        """A logical length (positions) as the columns it occupies (I5)."""
        return logical - self.pos_offset

    # ------------------------------------------------------------- events
    @property
    def has_window(self) -> bool:
        return self.window_since >= 0

    def took_window(self, step: int) -> None:
        """It holds a query-window slot from decode step ``step`` on (budget W1)."""
        self.window_since = step

    def left_window(self) -> None:
        self.window_since = -1

    def saw_suffix(self, suffix: int) -> None:
        self.max_suffix = max(self.max_suffix, suffix)

    def compacted(self, kept: int, evicted: int, pressure: bool = False) -> None:
        """A compaction of its suffix kept ``kept`` tokens and evicted ``evicted`` (every
        one before its answer, if it has one): positions stay logical (I5)."""
        self.pos_offset += evicted
        self.unpublished += evicted
        if self.answer_col is not None:
            self.answer_col -= evicted
        self.n_stored = kept
        self.compactions += 1
        self.pressure_compactions += pressure

    def published(self) -> int:
        """The columns evicted since the device's length of it was last read; from now on
        that length is this request's own (the next forward publishes it)."""
        evicted, self.unpublished = self.unpublished, 0
        return evicted

    def squeeze(self, floor: int) -> None:
        """Its floor is its budget until the pressure ends (budget A3)."""
        self.squeezed_to = floor

    def unsqueeze(self) -> None:
        self.squeezed_to = None

    def owns_prompt_from(self, c0: int) -> None:
        """Its prompt's columns from ``c0`` on are its own now (own_prompt.py)."""
        self.c0 = c0

    def asked_for_prompt(self, later: bool) -> None:
        """own_prompt.py asked for its prompt; ``later``: the prompt reaches the tree after
        this step, ask once more."""
        self.prompt_asks = self.prompt_asks - 1 if later else 0

    def loop_checked(self, generated: int) -> None:
        self.loop_checked_at = generated

    def loop_raised(self, boost: int, next_check: int) -> None:
        """The loop guard raised its budget's multiplier to ``boost`` (repetition.py)."""
        self.loop_boost = boost
        self.loop_guard += 1
        self.loop_checked_at = next_check

    def scanned(self, generated: int) -> None:
        """Its output was searched for the think-end marker up to ``generated`` tokens."""
        self.think_scanned = generated

    def answer_starts(self, col: int) -> None:
        """Its answer starts at column ``col`` (segments.py)."""
        self.answer_col = col

    def answer_finished(self) -> None:
        """Its thinking segment's last compaction is planned, or not needed."""
        self.answer_done = True

    def started_shadow(self, shadow) -> None:
        self.shadow = shadow

    def ended_shadow(self):
        """Its asynchronous compaction is committed or dropped; returns it."""
        shadow, self.shadow = self.shadow, None
        return shadow

    def offloaded_kv(self) -> None:
        """Its columns were copied to host as they are (a PD decode server retracts so): it
        resumes with its suffix, offset and counts; its window slot went with its row."""
        self.offloaded = True
        self.window_since = -1

    def reloaded(self) -> None:
        """Its columns are back on the device, in new slots: no global score of before is
        valid there."""
        self.offloaded = False
        self.n_stored = 0

    def restarted(self) -> "ReqState":
        """After a retraction the request re-prefills its tokens; its suffix starts over.
        Its compaction counts and its loop guard's state stay; c0 is found at its next
        decode step, from the prefix it re-matched."""
        return ReqState(c0=None, compactions=self.compactions,
                        pressure_compactions=self.pressure_compactions,
                        loop_boost=self.loop_boost, loop_guard=self.loop_guard,
                        loop_checked_at=self.loop_checked_at)


def compress_start(req, budget) -> int:
    """c0 of the request: past its prompt's full pages and what the radix tree protects."""
    return budget.compress_start(req.cache_protected_len, len(req.origin_input_ids))


def state_of(req, budget) -> ReqState:
    """The request's state, created (or its c0 found again after a retraction) on first use."""
    st = getattr(req, "zipage", None)
    if st is None:
        st = req.zipage = ReqState(c0=compress_start(req, budget))
    elif st.c0 is None:
        st.c0 = compress_start(req, budget)
    return st


def suffix_len(req, budget) -> int:
    """Columns of the request's compressible suffix (0 before its first decode step)."""
    st = getattr(req, "zipage", None)
    c0 = st.c0 if st is not None and st.c0 is not None else compress_start(req, budget)
    return max(0, req.kv_committed_len - c0)


def remaining_tokens(req) -> int:
    """Output tokens the request may still write."""
    return max(0, req.sampling_params.max_new_tokens - len(req.output_ids))


def in_flight(req) -> int:
    """Columns allocated past the committed ones: speculative decoding's reserve, which the
    step in flight writes its draft and verify tokens into (0 without it: a decode step
    allocates its one column as it commits it)."""
    return req.kv.kv_allocated_len - req.kv_committed_len


def physical_len(req, logical: int) -> int:
    """A logical length of the request (position count) as a column count (I5)."""
    st = getattr(req, "zipage", None)
    return st.physical(logical) if st is not None else logical


def restart(req) -> None:
    """A retracted request's state starts over (``ReqState.restarted``), unless its columns
    went to host to come back as they are (``ReqState.offloaded_kv``)."""
    st = getattr(req, "zipage", None)
    if st is not None and not st.offloaded:
        req.zipage = st.restarted()


def reloaded_lengths(batch):
    """[(row, physical length)] of the batch's requests whose columns came back from host
    (SGLang laid out their logical lengths), each marked reloaded."""
    updates = []
    for i, req in enumerate(batch.reqs):
        st = getattr(req, "zipage", None)
        if st is not None and st.offloaded:
            updates.append((i, st.physical(int(batch.seq_lens_cpu[i]))))
            st.reloaded()
    return updates


def set_lengths(batch, updates) -> None:
    """The batch's KV lengths after compactions: [(row, new physical length)]. New tensors,
    never in-place edits: an in-flight forward may hold the old ones. Speculative decoding
    with overlap schedules without lengths (seq_lens_cpu None): the step reads them from the
    device later, less what was evicted since (scheduler_hooks.published_lengths)."""
    if batch.seq_lens_cpu is None:
        return
    seq_lens_cpu = batch.seq_lens_cpu.clone()
    for i, new_len in updates:
        seq_lens_cpu[i] = new_len
    batch.seq_lens_cpu = seq_lens_cpu
    batch.seq_lens = seq_lens_cpu.to(batch.seq_lens.device, non_blocking=True)
    batch.seq_lens_sum = None
