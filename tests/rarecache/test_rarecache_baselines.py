"""The paper's baselines as it defines them: the l2 oracle's relative error (appendix C, figure 13) and
the least-squares single-source R² of the layer choice (section 3.1)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rf_eval.rarecache.fit import TransferSums, _ridge, _sse, single_source_r2
from rf_eval.rarecache.transfer import MappedCache
from rf_eval.selectors.mapped_cache import l2_error


def _entries(rows: list[list[float]]) -> torch.Tensor:
    """(1, 1 kv head, n, D) from one row per position."""
    return torch.tensor(rows, dtype=torch.float32)[None, None]


def test_l2_oracle_ranks_by_relative_error_of_keys_and_values_averaged_over_layers():
    # position 0: large entries, absolute error 1 -> relative 1/200; position 1: small entries,
    # absolute error 0.02 -> relative 1; position 2: exact. Absolute error ranks 0 first, relative 1 first.
    true_k, true_v = _entries([[10.0, 0.0], [0.1, 0.0], [1.0, 1.0]]), _entries([[0.0, 10.0], [0.0, 0.1], [1.0, 0.0]])
    pred_k, pred_v = _entries([[11.0, 0.0], [0.2, 0.0], [1.0, 1.0]]), _entries([[0.0, 10.0], [0.0, 0.0], [1.0, 0.0]])
    # layer 1 doubles the true entries and the errors: the same relative error, four times the absolute
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=true_k, values=true_v),
                                    SimpleNamespace(keys=2 * true_k, values=2 * true_v)])
    mapped = MappedCache(keys={0: pred_k, 1: 2 * pred_k}, values={0: pred_v, 1: 2 * pred_v}, score=None)
    got = l2_error(mapped, cache, 3)
    torch.testing.assert_close(got, torch.tensor([1 / 200, 1.0, 0.0]), rtol=1e-6, atol=1e-7)
    absolute = sum(((mapped.keys[i] - c.keys).pow(2) + (mapped.values[i] - c.values).pow(2)).sum((0, 1, 3))
                   for i, c in enumerate(cache.layers))
    assert int(absolute.argmax()) == 0  # the old definition picks the large-norm row
    assert int(got.argmax()) == 1


def _sums(seed: int = 0, scale: float = 1e-3) -> tuple[TransferSums, list[torch.Tensor], torch.Tensor]:
    """Synthetic sums: 3 source layers of width 4, one target layer of width 3, small-scale entries
    (where a ridge penalty of 0.01 on the unscaled Gram would change the fit a lot)."""
    gen = torch.Generator().manual_seed(seed)
    n = 64
    xs = [scale * torch.randn(n, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    y = xs[1] @ torch.randn(4, 3, generator=gen, dtype=torch.float64) + 0.3 * scale * torch.randn(
        n, 3, generator=gen, dtype=torch.float64) + xs[2][:, :3]
    sums = TransferSums(n_source=3, d_source=4, n_target=1, d_target=3)
    sums.add_document({s: xs for s in ("key", "value")}, {s: [y] for s in ("key", "value")})
    return sums, xs, y


def test_single_source_r2_is_least_squares():
    sums, xs, y = _sums()
    yc = y - y.mean(0)
    direct = []
    for x in xs:
        xc = x - x.mean(0)
        coef = torch.linalg.lstsq(xc, yc).solution
        direct.append(1 - (yc - xc @ coef).pow(2).sum() / yc.pow(2).sum())
    direct = torch.stack(direct)
    for side in ("key", "value"):
        torch.testing.assert_close(single_source_r2(sums, side, 0), direct, rtol=1e-5, atol=1e-6)
    # a ridge fit with the maps' lambda would not be: the penalty dominates these small Grams
    joint = sums.joint["key"]
    sst = torch.trace(sums.target_gram[("key", 0)].cxx)
    ridge = [float(1 - _sse(joint.cxx[b, b], joint.cxy[0][b], sst, _ridge(joint.cxx[b, b], joint.cxy[0][b], 0.01))
                   / sst) for b in (slice(0, 4), slice(4, 8), slice(8, 12))]
    assert max(abs(r - float(d)) for r, d in zip(ridge, direct)) > 0.1


def test_single_source_r2_of_a_rank_deficient_layer():
    """A source layer whose entries are collinear: the minimum-norm least-squares fit, not a failed solve."""
    sums, xs, y = _sums(seed=1, scale=1.0)
    dup = [torch.cat([x[:, :2], x[:, :2]], -1) for x in xs]
    sums2 = TransferSums(n_source=3, d_source=4, n_target=1, d_target=3)
    sums2.add_document({s: dup for s in ("key", "value")}, {s: [y] for s in ("key", "value")})
    got = single_source_r2(sums2, "key", 0)
    yc = y - y.mean(0)
    for j, x in enumerate(xs):
        xc = x[:, :2] - x[:, :2].mean(0)
        coef = torch.linalg.lstsq(xc, yc).solution
        assert float(got[j]) == pytest.approx(float(1 - (yc - xc @ coef).pow(2).sum() / yc.pow(2).sum()), abs=1e-5)
