"""--zipage-compress-prompt: the prompt pages no other running request holds compress too.

Once a request's prompt sits in the radix tree, locked by it (from its first decode step,
or its second under the overlap scheduler), and before its first compaction, the part
of its path that only it locks (the whole prompt when nobody shares it; what follows a
prefix that other running requests hold otherwise) is copied into pages of its own, and its
lock moves up to the deepest node another request holds (or the root). The tree keeps the
prompt as evictable cache, so a later request with the same prefix still hits it, and the
request's copy joins its compressible suffix: c0 drops to that node's depth (page aligned:
the tree splits at pages). Shared prefixes stay shared and uncompressed. Where the pool
cannot give the pages now, the request keeps its prompt whole (counted).

Without a radix tree (--disable-radix-cache) every prompt page is the request's own already:
c0 is what the cache protects (nothing), no copy. Other trees (hierarchical, sliding-window
hybrids) keep the prompt whole. Duck-types SGLang's Req, ScheduleBatch and RadixCache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch


@dataclass(frozen=True)
class SlotCopy:
    """KV of ``src`` slots copied to ``dst`` slots (disjoint), every layer and head; run by
    the executor on the stream of the next forward, before it (compaction.py C2), and timed
    with the compactions (compaction_gpu_ms)."""

    src: torch.Tensor  # [n] int64
    dst: torch.Tensor  # [n] int64

    @property
    def tensors(self):
        return self.src, self.dst


def own_start(last_node, protected: int, root) -> Tuple[int, object]:
    """(depth, node): the deepest node on the path to ``last_node`` (which ends at column
    ``protected``) that another holder locks too, or the root (depth 0). Below it, every
    node is locked by this request alone (lock counts only grow towards the root)."""
    node, end = last_node, protected
    while node is not None and node is not root and node.lock_ref == 1:
        end -= len(node.key)
        node = node.parent
    return end, node


def kind(tree) -> str:
    """'radix' (copy and release), 'own' (no tree: the prompt is the request's), or 'keep'."""
    if getattr(tree, "is_chunk_cache", lambda: False)() or getattr(tree, "disable", False):
        return "own"
    return "radix" if type(tree).__name__ == "RadixCache" else "keep"


class OwnPrompt:
    def __init__(self, alloc: Callable, pending: List, stats):
        self.alloc = alloc  # alloc(batch, n): n slots, evicting unused tree pages first
        self.pending = pending  # the executor's queue (planner.pending)
        self.stats = stats

    def take(self, req, st, batch) -> Optional[bool]:
        """At a decode step before the request's first compaction since its (re-)prefill:
        set st.c0 below the prompt pages it alone holds, copying them into its own pages
        first. Returns whether c0 moved, or None while its prompt is not in the tree yet (the
        overlap scheduler inserts it when it processes the prefill's result, after the
        request's first decode step was planned): it is asked again at its next step."""
        tree = batch.tree_cache
        protected = req.cache_protected_len
        how = kind(tree)
        if how == "own":
            moved = protected < st.c0
            st.owns_prompt_from(min(st.c0, protected))
            return moved
        if how == "keep" or req.last_node is None:
            return False
        if protected < st.c0:  # its prompt pages are still its own, not yet the tree's
            return None
        start, node = own_start(req.last_node, protected, tree.root_node)
        n = protected - start
        if n <= 0:
            return False
        fresh = self.alloc(batch, n)
        if fresh is None:
            self.stats.add("prompt_copy_misses")
            return False
        row = batch.req_to_token_pool.req_to_token[req.req_pool_idx]
        fresh = fresh.to(device=row.device, dtype=torch.int64)
        self.pending.append(SlotCopy(row[start:protected].to(torch.int64, copy=True), fresh))
        row[start:protected] = fresh.to(row.dtype)
        tree.dec_lock_ref(req.last_node)
        tree.inc_lock_ref(node)
        req.last_node = node
        req.cache_protected_len = start
        req.prefix_indices = req.prefix_indices[:start]
        st.owns_prompt_from(start)
        self.stats.add("prompt_copies")
        self.stats.add("prompt_tokens_owned", n)
        return True
