"""The embedded build's ranks: the summed gradient is the same bytes on one process or several, for any number of
parts, and a rank that fails stops the build with a message instead of a wait."""

import pytest
import torch

from draftline.target.embedded.ranks import RankFailed, my_parts, run_ranks, summed_gradients


def _steps(parts: int, rank: int, world: int) -> bytes:
    """Five SGD steps of a small linear model whose batch is split into ``parts``; the weights' bytes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(7, 3)
    params = list(model.parameters())
    data = torch.randn(5, parts, 4, 7)  # step, part, rows, features: every rank sees the same batches
    for step in range(5):
        mine = []
        for part in my_parts(parts, rank, world):
            loss = model(data[step, part]).pow(3).sum() / 17  # odd powers and sums: rounding differs with the order
            loss.backward()
            mine.append(torch.cat([p.grad.flatten() for p in params] + [loss.detach().reshape(1)]))
            model.zero_grad(set_to_none=True)
        summed_gradients(params, mine, parts, rank, world)
        with torch.no_grad():
            for p in params:
                p -= 0.01 * p.grad
        model.zero_grad(set_to_none=True)
    return b"".join(p.detach().numpy().tobytes() for p in params)


@pytest.mark.parametrize("parts, world", [(2, 2), (3, 2), (4, 3)])
def test_the_weights_are_the_same_bytes_on_one_process_or_several(parts, world):
    assert run_ranks(world, lambda rank, w: _steps(parts, rank, w)) == _steps(parts, 0, 1)


def test_a_sum_in_another_order_is_other_bytes():
    """The check above can fail: summing the parts in another order changes the last bits."""
    g = [torch.tensor([1e8, 1.0, 0.1], dtype=torch.float32), torch.tensor([-1e8, 3e-8, 0.2]),
         torch.tensor([1.0, 1e8, 0.3])]
    forward, backward = (g[0] + g[1]) + g[2], (g[2] + g[1]) + g[0]
    assert not torch.equal(forward, backward)
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert torch.equal(summed_gradients(params, g, 3, 0, 1), forward) and torch.equal(params[0].grad, forward[:2])


def _fails_on_rank_1(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank 1 broke")
    summed_gradients([torch.nn.Parameter(torch.zeros(1))], [torch.zeros(2)], 2, rank, world)
    return rank


def test_a_rank_that_fails_stops_the_build_with_a_message():
    with pytest.raises(RankFailed, match=r"rank\(s\) \[1\] exited badly .* target.embedded.workers: 1"):
        run_ranks(2, _fails_on_rank_1)
