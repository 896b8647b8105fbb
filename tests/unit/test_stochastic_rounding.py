"""stochastic_rounding: rounding is unbiased where round-to-nearest loses the update, lands on
a bf16 neighbour, keeps specials; the Adam matches torch's and keeps small updates in bf16."""

import pytest
import torch

from amp_tutorial.stochastic_rounding import StochasticRoundingAdam, stochastic_round_bf16


def neighbours(x: float) -> tuple[float, float]:
    """The two bf16 numbers around ``x`` (equal when ``x`` is one)."""
    down = torch.tensor(x).to(torch.bfloat16)
    down = down if down.float() <= x else torch.nextafter(down, torch.tensor(-1e9).bfloat16())
    up = down if down.float() == x else torch.nextafter(down, torch.tensor(1e9).bfloat16())
    return down.float().item(), up.float().item()


@pytest.mark.parametrize("x", [1.0 - 1e-3, 1.0 + 1e-3, 0.75 + 2**-10, -0.3 - 1e-4, 3e-20])
def test_the_mean_of_many_roundings_is_x_where_nearest_is_not(x: float) -> None:
    values = torch.full((200_000,), x)
    rounded = stochastic_round_bf16(values, torch.Generator().manual_seed(0)).float()
    down, up = neighbours(x)
    assert set(rounded.unique().tolist()) == {down, up}  # only the two neighbours
    gap = up - down
    # 200,000 draws: the mean's standard deviation is at most gap / 2 / sqrt(200,000) = gap / 894
    assert rounded.mean().item() == pytest.approx(x, abs=gap / 100)
    nearest = values.to(torch.bfloat16).float().mean().item()
    assert abs(nearest - x) > gap / 10  # round to nearest is off by a fixed share of the gap


def test_an_update_below_half_an_ulp_arrives_on_average_and_not_at_all_when_rounded() -> None:
    gen = torch.Generator().manual_seed(1)
    nearest = stochastic = torch.ones(20_000, dtype=torch.bfloat16)
    for _ in range(100):
        nearest = (nearest.float() - 1e-3).to(torch.bfloat16)
        stochastic = stochastic_round_bf16(stochastic.float() - 1e-3, gen)
    assert torch.all(nearest == 1.0)
    assert stochastic.float().mean().item() == pytest.approx(0.9, abs=1e-3)


def test_bf16_values_and_specials_come_back_unchanged() -> None:
    exact = torch.tensor(
        [
            0.0,
            -0.0,
            1.0,
            -2.5,
            float("inf"),
            -float("inf"),
            torch.finfo(torch.bfloat16).max,
            torch.finfo(torch.bfloat16).tiny,
        ]
    )
    assert torch.equal(stochastic_round_bf16(exact), exact.to(torch.bfloat16))
    assert torch.signbit(stochastic_round_bf16(torch.tensor([-0.0]))).item()
    nans = torch.tensor([float("nan"), -float("nan")])
    nans[0:1].view(torch.int32).fill_(0x7FFFFFFF)  # the NaN whose rounding would pass int32's top
    assert stochastic_round_bf16(nans).isnan().all()


def test_only_float32_is_taken() -> None:
    with pytest.raises(TypeError, match="float32"):
        stochastic_round_bf16(torch.ones(2, dtype=torch.float64))


def test_on_fp32_weights_the_adam_is_torchs_adam() -> None:
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    theirs.load_state_dict(ours.state_dict())
    optimizers = (
        StochasticRoundingAdam(ours.parameters(), lr=1e-2),
        torch.optim.Adam(theirs.parameters(), lr=1e-2),
    )
    x = torch.randn(8, 5)
    for _ in range(5):
        for model, optimizer in zip((ours, theirs), optimizers, strict=True):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bf16_weights_keep_small_updates_with_stochastic_rounding_only() -> None:
    """A weight of 1.0 pulled by a constant gradient: Adam steps lr = 1e-3 each time, below
    half the bf16 gap under 1.0 (2^-9), so round to nearest never moves it."""
    moved = {}
    for stochastic in (False, True):
        w = torch.ones(10_000, dtype=torch.bfloat16, requires_grad=True)
        optimizer = StochasticRoundingAdam(
            [w], lr=1e-3, stochastic=stochastic, generator=torch.Generator().manual_seed(0)
        )
        for _ in range(50):
            w.grad = torch.ones_like(w)
            optimizer.step()
        assert w.dtype == optimizer.state[w]["exp_avg"].dtype == torch.bfloat16
        moved[stochastic] = 1.0 - w.float().mean().item()
    assert moved[False] == 0.0
    assert moved[True] == pytest.approx(50 * 1e-3, rel=0.02)
