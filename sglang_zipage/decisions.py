"""The compaction decisions one scheduler took: a count and a running digest.

Under tensor parallelism every rank runs its own scheduler and its own zipage runtime. Each
holds its slice of KV heads and scores them with its own query heads, so each keeps its own
columns per head; but which requests compact, at which step, down to how many columns and
with how many pool slots free afterwards must be the same on every rank, or their KV pools
and block tables drift apart. The plan is made from CPU state that every rank shares (the
same requests, lengths and allocator history), so the digests agree. /server_info gathers
every rank's digest (hooks) and says whether they do.
"""

from __future__ import annotations

import hashlib


class DecisionLog:
    def __init__(self):
        self.count = 0
        self._hash = hashlib.blake2b(digest_size=8)

    def record(self, step: int, rid: str, c0: int, suffix: int, kept: int, free_slots: int) -> None:
        """One compaction: decode step, request, suffix start and length, columns kept,
        pool slots free once its surplus went back to the allocator."""
        self._hash.update(repr((step, rid, c0, suffix, kept, free_slots)).encode())
        self.count += 1

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def summary(self) -> dict:
        return {"decisions": self.count, "decision_digest": self.digest}


def across_ranks(summary: dict, group) -> dict:
    """Every rank's summary, gathered over SGLang's TP CPU (gloo) group. A collective: each
    rank calls it at the same point, as every rank handles the same control request."""
    import torch.distributed as dist

    ranks = [None] * dist.get_world_size(group)
    dist.all_gather_object(ranks, summary, group=group)
    return {"tp_ranks": ranks,
            "tp_ranks_agree": all(r["decision_digest"] == ranks[0]["decision_digest"] for r in ranks)}
