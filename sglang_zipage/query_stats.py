"""Calibrated query statistics: the calibrated scorer's stand-in for stored queries.

A compaction asks which cached tokens the request's future queries will attend to. The
window scorer answers with the last W queries it kept per request; the calibrated scorer
answers with what each head's queries look like, measured once per model over ordinary text
(``sglang_zipage.calibrate``): per layer and query head, K centroids of its pre-RoPE queries
(k-means, ``centroids`` [L, Hq, K, D]), beside their mean and the mean magnitude of each
rotary pair (``mean``, ``pair_norm``: the single-query statistics published scorers use).
Rotated to a request's next position, the K centroids score a cached key as K typical
queries would: keys are cached after RoPE, so the key's own position enters only through its
stored rotation and nothing is inverted. In the engine (``DeviceQueries``) a compaction
rotates them to each of its requests' positions (kernels.Rope: one copy per request, the size
of a window slot for K = W) and scores them as it scores W stored queries;
``expected_queries`` is the same rotation in torch, for the HF reference. No per-request
state: the file's few MB replace the query window.

Rotary pairs follow the model's style: ``neox`` pairs dim i with i + R/2, else 2i with 2i+1;
dims past R are not rotated. ``cos_sin`` is the model's own table (SGLang's
``cos_sin_cache``: [positions, R], cos then sin), so scaled RoPE variants come for free.
Imports torch, the kernels' Rope and scoring's Queries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import torch

from sglang_zipage.kernels.reference import Rope, rotate
from sglang_zipage.scoring import Queries

NEXT = (1,)  # the calibrated scorer's offset: the request's next position
GEOMETRIC = tuple(2 ** i for i in range(16))  # 1 .. 32768 ahead: the single-mean baseline
FORMAT = "sglang-zipage query stats 1"


def pairs(x: torch.Tensor, rot: int, neox: bool, start: int = 0):
    """The two halves of each rotary pair of x's dims [start, start + rot) (views)."""
    x = x[..., start:start + rot]
    if neox:
        return x[..., :rot // 2], x[..., rot // 2:]
    return x[..., 0::2], x[..., 1::2]


@dataclass
class QueryStats:
    mean: torch.Tensor  # [L, Hq, D] float32: mean pre-RoPE query per layer and query head
    pair_norm: torch.Tensor  # [L, Hq, R/2] float32: mean |pair| of each rotary pair
    centroids: torch.Tensor  # [L, Hq, K, D] float32: k-means centroids of the queries
    neox: bool  # rotary pair layout
    tokens: int  # query tokens the means are over (per layer)
    meta: Dict = field(default_factory=dict)  # model, texts, command
    rope_start: int = 0  # where the rotary dims begin (MLA's q_nope | q_rope: the nope width)
    layers: Optional[Sequence[int]] = None  # the model's layer id of each row (None: 0..L-1)

    @property
    def rotary_dim(self) -> int:
        return 2 * self.pair_norm.shape[-1]

    @property
    def layer_ids(self) -> list:
        return list(self.layers) if self.layers is not None else list(range(len(self.mean)))

    def queries(self, single_mean: bool = False) -> torch.Tensor:
        """[L, K, Hq, D]: the centroids, or (``single_mean``) the mean as K = 1."""
        if single_mean:
            return self.mean[:, None]
        return self.centroids.transpose(1, 2)

    # ------------------------------------------------------------ storage
    def save(self, path: str) -> None:
        from safetensors.torch import save_file

        meta = {"format": FORMAT, "neox": json.dumps(self.neox), "tokens": str(self.tokens),
                "meta": json.dumps(self.meta), "rope_start": str(self.rope_start),
                "layers": json.dumps(self.layer_ids)}
        save_file({"mean": self.mean.contiguous(), "pair_norm": self.pair_norm.contiguous(),
                   "centroids": self.centroids.half().contiguous()}, path, metadata=meta)

    @classmethod
    def load(cls, path: str) -> "QueryStats":
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"{path} is not a query statistics file ({FORMAT!r}); make one "
                                 f"with python -m sglang_zipage.calibrate")
            return cls(f.get_tensor("mean"), f.get_tensor("pair_norm"),
                       f.get_tensor("centroids").float(),
                       json.loads(meta["neox"]), int(meta["tokens"]), json.loads(meta["meta"]),
                       int(meta.get("rope_start", 0)), json.loads(meta.get("layers", "null")))


def kmeans(x: torch.Tensor, k: int, iters: int = 25, seed: int = 0):
    """Batched k-means: x [H, N, D] -> (centroids [H, k, D], weights [H, k]: the share of
    points in each); starts from k of the points drawn at random (seeded), float32."""
    x = x.float()
    h, n, _ = x.shape
    g = torch.Generator().manual_seed(seed)
    c = x[:, torch.randperm(n, generator=g)[:k]].clone()
    for _ in range(iters):
        assign = torch.cdist(x, c).argmin(-1)  # [H, N]
        one = torch.nn.functional.one_hot(assign, k).float()  # [H, N, k]
        count = one.sum(1)  # [H, k]
        c = torch.where(count[..., None] > 0,
                        one.transpose(1, 2) @ x / count.clamp_min(1)[..., None], c)
    return c, count / n


class Accumulator:
    """Sums of pre-RoPE queries per layer (float64) and a sample of them for the centroids:
    every 4th query, at most ``max_samples`` per layer, kept on the CPU. Rotary pairs are
    the dims [start, start + rotary) in the ``neox`` or interleaved layout."""

    def __init__(self, neox: bool, start: int = 0, max_samples: int = 1 << 14):
        self.neox, self.start, self.max_samples = neox, start, max_samples
        self.sums: Dict[int, torch.Tensor] = {}
        self.norms: Dict[int, torch.Tensor] = {}
        self.counts: Dict[int, int] = {}
        self.samples: Dict[int, list] = {}
        self._sampled: Dict[int, int] = {}

    def add(self, layer: int, q: torch.Tensor, rotary_dim: int) -> None:
        """q: [T, Hq, D] pre-RoPE queries of one layer."""
        q = q.detach().to(torch.float64)
        room = self.max_samples - self._sampled.get(layer, 0)
        if room > 0:
            sample = q[::4][:room].float().cpu()
            self.samples.setdefault(layer, []).append(sample)
            self._sampled[layer] = self._sampled.get(layer, 0) + sample.shape[0]
        a, b = pairs(q, rotary_dim, self.neox, self.start)
        s, n = q.sum(0), torch.sqrt(a * a + b * b).sum(0)
        if layer in self.sums:
            self.sums[layer] += s
            self.norms[layer] += n
            self.counts[layer] += q.shape[0]
        else:
            self.sums[layer], self.norms[layer], self.counts[layer] = s, n, q.shape[0]

    def state(self) -> Dict:
        """What a tensor-parallel rank saves (CPU tensors), for ``join``."""
        return {"neox": self.neox, "start": self.start, "counts": dict(self.counts),
                "sums": {l: t.cpu() for l, t in self.sums.items()},
                "norms": {l: t.cpu() for l, t in self.norms.items()},
                "samples": {l: torch.cat(v) for l, v in self.samples.items()}}

    @classmethod
    def join(cls, states: Sequence[Dict]) -> "Accumulator":
        """The ranks' accumulators, in rank order: each holds a slice of the query heads of
        the same tokens."""
        acc = cls(states[0]["neox"], states[0]["start"])
        for layer, n in states[0]["counts"].items():
            acc.counts[layer] = n
            acc.sums[layer] = torch.cat([st["sums"][layer] for st in states])
            acc.norms[layer] = torch.cat([st["norms"][layer] for st in states])
            acc.samples[layer] = [torch.cat([st["samples"][layer] for st in states], 1)]
        return acc

    def stats(self, queries: int, meta: Optional[Dict] = None) -> QueryStats:
        """The statistics, with ``queries`` centroids per head."""
        layers = sorted(self.sums)
        counts = {self.counts[l] for l in layers}
        assert len(counts) == 1, counts
        n = counts.pop()
        mean = torch.stack([self.sums[l] / n for l in layers]).float().cpu()
        norm = torch.stack([self.norms[l] / n for l in layers]).float().cpu()
        centroids = torch.stack([kmeans(torch.cat(self.samples[l]).transpose(0, 1), queries)[0]
                                 for l in layers])
        return QueryStats(mean, norm, centroids, self.neox, n, meta or {}, self.start, layers)


def expected_queries(queries: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
                     neox: bool, offsets: Sequence[int] = NEXT) -> torch.Tensor:
    """The statistics' queries rotated to each request's future positions.

    queries: [L, K, Hq, D] pre-RoPE (QueryStats.queries); cos_sin: [P, R] the model's RoPE
    table (cos | sin); positions: [R] int64, each request's next position t. Returns
    [L, R, K x len(offsets), Hq, D] float32 at t + each offset (clamped to the table);
    query w = k * len(offsets) + o."""
    table = cos_sin.float()
    off = torch.tensor(offsets, dtype=torch.int64, device=positions.device)
    pos = (positions[:, None].to(torch.int64) + off[None, :]).clamp_(max=table.shape[0] - 1)
    cs = table[pos.to(table.device)]  # [R, O, R_dims]
    half = cs.shape[-1] // 2
    cos = cs[..., :half][None, :, None, :, None]  # [1, R, 1, O, 1, R/2]
    sin = cs[..., half:][None, :, None, :, None]
    x = queries.float().to(table.device)[:, None, :, None]  # [L, 1, K, 1, Hq, D]
    n_l, k, hq, d = queries.shape
    out = rotate(x.expand(n_l, pos.shape[0], k, len(offsets), hq, d), cos, sin, neox)
    return out.reshape(n_l, pos.shape[0], k * len(offsets), hq, d)


class DeviceQueries:
    """The calibrated scorer's queries on the device: the statistics' centroids of the scored
    layers and this rank's query heads in the model's dtype, [L, 1, K, Hq, D], and the
    model's RoPE table; ``at`` hands them to a plan's scoring with its requests' next
    positions, which the scoring rotates them to. ``start``: where the rotary dims begin in a
    stored query row (0; MLA's compact q_nope | q_rope: the nope width)."""

    def __init__(self, stats: QueryStats, layers: Sequence[int], heads: slice,
                 cos_sin: torch.Tensor, neox: bool, dtype: torch.dtype, start: int = 0):
        if (stats.neox != neox or stats.rotary_dim != cos_sin.shape[-1]
                or stats.rope_start != start):
            raise ValueError(f"the query statistics were measured with rotary pairs "
                             f"{'neox' if stats.neox else 'interleaved'} over "
                             f"{stats.rotary_dim} dims from {stats.rope_start}; this model "
                             f"rotates {'neox' if neox else 'interleaved'} pairs over "
                             f"{cos_sin.shape[-1]} from {start}: calibrate it again")
        missing = sorted(set(layers) - set(stats.layer_ids))
        if missing:
            raise ValueError(f"the query statistics hold layers {stats.layer_ids[:8]}..., not "
                             f"the scored layers {missing[:8]}: calibrate this model again")
        rows = [stats.layer_ids.index(l) for l in layers]
        queries = stats.queries()[rows][:, :, heads]  # [L, K, Hq, D]
        self.queries = queries[:, None].to(device=cos_sin.device, dtype=dtype).contiguous()
        self.cos_sin, self.neox, self.start = cos_sin.contiguous(), neox, start

    @property
    def nbytes(self) -> int:
        return self.queries.numel() * self.queries.element_size()

    def at(self, positions: torch.Tensor) -> Queries:
        """The queries of R requests whose next positions - 1 are ``positions`` [R] (CPU
        int64): the rows expanded over R (no copy), rotated in the kernel to positions + 1
        (clamped to the table)."""
        n_layers, _, k, hq, d = self.queries.shape
        nxt = (positions.to(torch.int64) + NEXT[0]).clamp_(max=self.cos_sin.shape[0] - 1)
        rope = Rope(self.cos_sin, nxt.to(self.cos_sin.device), self.start, self.neox)
        return Queries(self.queries.expand(n_layers, positions.shape[0], k, hq, d), rope)
