"""Calibrated query statistics (query_stats.py): RoPE in both pair layouts, the mean query at
a future position scoring a cached key by relative position only, and the file round trip."""

import pytest
import torch

from sglang_zipage.query_stats import (GEOMETRIC, Accumulator, QueryStats, expected_queries,
                                       kmeans, rotate)


def table(positions, rot, base=10000.0):
    """A RoPE table as SGLang keeps it: [P, R] cos | sin."""
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat([ang.cos(), ang.sin()], -1)


@pytest.mark.parametrize("neox", [True, False])
def test_rotation_is_undone_by_its_inverse_and_keeps_unrotated_dims(neox):
    x = torch.randn(5, 3, 10, dtype=torch.float64)
    t = table(64, 8)[torch.tensor([0, 3, 7, 40, 63])][:, None]  # rotary dims 8 of 10
    cos, sin = t[..., :4], t[..., 4:]
    y = rotate(x, cos, sin, neox)
    assert torch.equal(y[..., 8:], x[..., 8:])
    assert torch.allclose(rotate(y, cos, sin, neox, inverse=True), x)
    assert torch.allclose(y[0], x[0])  # position 0: no rotation
    scaled = rotate(x, 1.3 * cos, 1.3 * sin, neox)  # a table scaled by YaRN's mscale
    assert torch.allclose(scaled[..., :8], 1.3 * y[..., :8])
    assert torch.allclose(rotate(scaled, 1.3 * cos, 1.3 * sin, neox, inverse=True), x)


@pytest.mark.parametrize("neox", [True, False])
def test_a_keys_score_depends_on_its_distance_to_the_future_query_only(neox):
    """RoPE's relative property, what lets stored (rotated) keys be scored unchanged: the
    mean query at t + d dotted with a key cached at position p is the same for every t, p
    with the same t + d - p."""
    rot, tab = 16, table(40000, 16)  # holds t + every offset
    mean, key = torch.randn(1, 1, 2, rot, dtype=torch.float64), torch.randn(rot, dtype=torch.float64)

    def logit(t, p):
        q = expected_queries(mean, tab, torch.tensor([t]), neox, GEOMETRIC)[0, 0, :, 0]  # [W, D]
        k = rotate(key, tab[p, :8], tab[p, 8:], neox)
        return q.double() @ k

    assert torch.allclose(logit(100, 40), logit(300, 240), atol=1e-4)
    assert not torch.allclose(logit(100, 40), logit(100, 41), atol=1e-4)


def test_expected_queries_order_and_offsets_clamped_to_the_table():
    tab = table(100, 8)
    centroids = torch.randn(3, 5, 4, 8)  # [L, K, Hq, D]
    q = expected_queries(centroids, tab, torch.tensor([5, 90]), True, (1, 2, 64))
    assert q.shape == (3, 2, 5 * 3, 4, 8)
    # query w = k * offsets + o: centroid 2 at offset 2 is centroid 2 rotated to t + 2
    def at(k, pos):
        return rotate(centroids[:, k], tab[pos, :4], tab[pos, 4:], True).float()

    assert torch.allclose(q[:, 0, 2 * 3 + 1], at(2, 5 + 2), atol=1e-6)
    assert torch.allclose(q[:, 0, 4 * 3 + 2], at(4, 5 + 64), atol=1e-6)
    # past the table's last position an offset reads the last one
    assert torch.allclose(q[:, 1, 4 * 3 + 2], at(4, 99), atol=1e-6)


def test_kmeans_finds_separated_clusters_and_their_shares():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = torch.cat([centres[i] + 0.1 * torch.randn(n, 2, generator=g)
                   for i, n in enumerate((50, 30, 20))])[None]
    c, w = kmeans(x, 3)
    order = torch.tensor(
        [int(torch.cdist(centres[i:i + 1], c[0]).argmin()) for i in range(3)])
    assert torch.allclose(c[0, order], centres, atol=0.1)
    assert torch.allclose(w[0, order], torch.tensor([0.5, 0.3, 0.2]))


def test_accumulated_means_and_the_file_round_trip(tmp_path):
    acc = Accumulator(neox=True)
    qs = [torch.randn(7, 2, 4), torch.randn(5, 2, 4)]
    for q in qs:
        acc.add(0, q, rotary_dim=4)
        acc.add(1, 2 * q, rotary_dim=4)
    stats = acc.stats(2, {"model": "x"})
    every = torch.cat(qs)
    assert stats.tokens == 12
    assert torch.allclose(stats.mean[0], every.mean(0)) and torch.allclose(stats.mean[1], 2 * every.mean(0))
    pair = torch.sqrt(every[..., :2] ** 2 + every[..., 2:] ** 2).mean(0)
    assert torch.allclose(stats.pair_norm[0], pair)
    assert stats.centroids.shape == (2, 2, 2, 4)
    assert stats.queries().shape == (2, 2, 2, 4) and stats.queries(single_mean=True).shape == (2, 1, 2, 4)
    stats.save(str(tmp_path / "s.safetensors"))
    back = QueryStats.load(str(tmp_path / "s.safetensors"))
    assert torch.equal(back.mean, stats.mean)
    assert torch.equal(back.centroids, stats.centroids.half().float())  # stored in fp16
    assert back.meta == {"model": "x"} and back.neox
    with pytest.raises(ValueError, match="python -m sglang_zipage.calibrate"):
        from safetensors.torch import save_file
        save_file({"mean": stats.mean}, str(tmp_path / "other.safetensors"))
        QueryStats.load(str(tmp_path / "other.safetensors"))
