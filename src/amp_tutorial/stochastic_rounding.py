"""Stochastic rounding of fp32 into bf16, and an Adam that stores bf16 weights with it, so small
updates survive in expectation instead of rounding away (as in torchao.optim's
``bf16_stochastic_round=True``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_LOW_BITS = 1 << 16  # fp32 keeps 16 more mantissa bits than bf16


def stochastic_round_bf16(
    x: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``x`` (fp32) rounded to one of its two bf16 neighbours, away from zero with probability
    (distance from the one nearer zero) / (gap between them): unbiased, E[result] = x.

    Adds 16 uniform random bits below bf16's last bit of the fp32 pattern, then truncates them.
    NaN stays NaN; a value within an ulp of the largest finite bf16 may round to inf.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"stochastic_round_bf16 takes float32, got {x.dtype}")
    # drawn where the generator lives (a seeded CPU generator serves every device), then moved
    noise = torch.randint(
        0,
        _LOW_BITS,
        x.shape,
        dtype=torch.int32,
        device=x.device if generator is None else generator.device,
        generator=generator,
    ).to(x.device)
    bits = x.contiguous().view(torch.int32)
    # where rounding away from zero would pass int32's top (NaN patterns only), keep x
    rounded = torch.where(
        bits < torch.iinfo(torch.int32).max - _LOW_BITS, (bits + noise) & -_LOW_BITS, bits
    )
    rounded = rounded.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are 0
    return torch.where(x.isnan(), x.to(torch.bfloat16), rounded)


class StochasticRoundingAdam(torch.optim.Optimizer):
    """Adam (no weight decay) for bf16 weights: each step is computed in fp32 from the bf16
    weight, gradient and moments, as torchao.optim's ``single_param_adam`` does; the new weight
    is stored by stochastic rounding (``stochastic=False``: round to nearest), the two moments
    round to nearest. State is bf16 like the weights: 8 bytes per weight with the gradient.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        stochastic: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
        self.stochastic = stochastic
        self.generator = generator

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        """One Adam step for every parameter with a gradient."""
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(
                        step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)
                    )
                state["step"] += 1
                grad = p.grad.float()
                exp_avg = state["exp_avg"].float().lerp(grad, 1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().lerp(grad.square(), 1 - beta2)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
                denom = (exp_avg_sq / (1 - beta2 ** state["step"])).sqrt() + group["eps"]
                new = p.float() - group["lr"] * (exp_avg / (1 - beta1 ** state["step"])) / denom
                if self.stochastic and p.dtype == torch.bfloat16:
                    new = stochastic_round_bf16(new, self.generator)
                p.copy_(new)
