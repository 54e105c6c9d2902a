"""MetricAttentionalAggregation (issue 18, §2): the formula against a plain
per-set computation, index and ptr input, empty sets, far-apart sets,
gradients, torch.compile and use inside a PyG model."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import global_mean_pool

from pyg_metric_attn.nn.aggr import MetricAttentionalAggregation


def reference(aggr, x, batch, num_sets):
    """Per set, float64: softmax over members of -|phi(q) - phi(x)|^2 / t."""
    out = []
    with torch.no_grad():
        queries = aggr.phi(aggr.query).double()
        members = aggr.phi(x).double()
        values = aggr.lin_value(x).double()
    for s in range(num_sets):
        rows = batch == s
        if not rows.any():
            out.append(torch.zeros(aggr.num_queries, aggr.out_channels,
                                   dtype=torch.double))
            continue
        logits = -torch.cdist(queries, members[rows]).square() / aggr.time_scale()
        out.append(torch.softmax(logits, -1) @ values[rows])
    out = torch.stack(out)
    return out.flatten(1) if aggr.concat else out.mean(1)


@pytest.mark.parametrize('metric', ['metric', 'l2'])
@pytest.mark.parametrize('concat', [True, False])
def test_matches_per_set_reference(metric, concat):
    torch.manual_seed(0)
    aggr = MetricAttentionalAggregation(6, 5, num_queries=3, metric=metric,
                                        time_scale=2.0, concat=concat)
    x = torch.randn(20, 6)
    batch = torch.tensor([0] * 7 + [2] * 8 + [3] * 5)  # set 1 is empty
    out = aggr(x, batch, dim_size=4)
    assert out.shape == (4, 15 if concat else 5)
    torch.testing.assert_close(out.double(), reference(aggr, x, batch, 4),
                               atol=1e-5, rtol=1e-5)
    assert not out[1].any()
    ptr = torch.tensor([0, 7, 7, 15, 20])
    torch.testing.assert_close(aggr(x, ptr=ptr), out)
    # unsorted index: same per-set result
    perm = torch.randperm(20)
    torch.testing.assert_close(aggr(x[perm], batch[perm], dim_size=4), out,
                               atol=1e-6, rtol=1e-5)


def test_far_apart_sets_and_gradients():
    torch.manual_seed(1)
    aggr = MetricAttentionalAggregation(4, 3, num_queries=2, metric='l2',
                                        time_scale=1e6, learn_time_scale=True)
    x = torch.randn(10, 4) * 100
    x[5:] += 1e4
    batch = torch.tensor([0] * 5 + [1] * 5)
    out = aggr(x, batch)
    torch.testing.assert_close(out.double(), reference(aggr, x, batch, 2),
                               atol=1e-3, rtol=1e-4)
    out.square().sum().backward()
    for name, p in aggr.named_parameters():
        assert p.grad is not None and p.grad.isfinite().all(), name


def test_compiles_and_trains_in_a_model():
    torch.manual_seed(2)
    aggr = MetricAttentionalAggregation(4, 3, num_queries=2)
    x = torch.randn(12, 4)
    batch = torch.tensor([0] * 6 + [1] * 6)
    compiled = torch.compile(aggr, backend='aot_eager')
    torch.testing.assert_close(compiled(x, batch, dim_size=2),
                               aggr(x, batch, dim_size=2))
    # A set-level target that mean pooling cannot see: the spread of the set.
    head = torch.nn.Linear(6, 1)
    params = list(aggr.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=0.05)
    g = torch.Generator().manual_seed(0)
    scales = torch.rand(32, generator=g) * 2 + 0.1
    x = torch.randn(32 * 8, 4, generator=g) * scales.repeat_interleave(8)[:, None]
    batch = torch.arange(32).repeat_interleave(8)
    assert global_mean_pool(x, batch).shape == (32, 4)
    for _ in range(60):
        opt.zero_grad()
        loss = (head(aggr(x, batch)).squeeze(1) - scales).square().mean()
        loss.backward()
        opt.step()
    assert loss < 0.25 * scales.var()


def test_clear_errors():
    with pytest.raises(ValueError, match="metric must be 'metric' or 'l2'"):
        MetricAttentionalAggregation(4, 3, metric='dot')
    with pytest.raises(ValueError, match="'num_queries' must be positive"):
        MetricAttentionalAggregation(4, 3, num_queries=0)
    with pytest.raises(ValueError, match=r"'x' must be \[num_members, 4\]"):
        MetricAttentionalAggregation(4, 3)(torch.randn(5, 3))
    aggr = MetricAttentionalAggregation(4, 3)
    params = [p.detach().clone() for p in aggr.parameters()]
    aggr.reset_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(params, aggr.parameters(),
                                                     strict=True))
