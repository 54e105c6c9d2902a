"""Learning-rate schedules stepped once per optimiser step (pass them to
:class:`~pyg_metric_attn.training.Trainer` as ``batch_scheduler``)."""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosine:
    r"""LR factor: linear warm-up over ``warmup_steps``, then a cosine decay
    from 1 to ``final_fraction`` at ``total_steps`` (constant afterwards):

    .. math::
        f(s) = \begin{cases} s / w & s < w \\
        r + (1 - r)\,\tfrac12\left(1 + \cos\left(\pi \tfrac{s - w}{T - w}\right)
        \right) & w \le s \le T \end{cases}

    ``total_steps=None`` keeps the factor at 1 after the warm-up.
    """
    def __init__(self, warmup_steps: int, total_steps: int | None = None,
                 final_fraction: float = 0.0):
        if warmup_steps < 0:
            raise ValueError(f"'warmup_steps' must be >= 0, got {warmup_steps}")
        if total_steps is not None and total_steps <= warmup_steps:
            raise ValueError(f"'total_steps' ({total_steps}) must exceed "
                             f"'warmup_steps' ({warmup_steps})")
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.final_fraction = final_fraction

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.total_steps is None:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps)
                       / (self.total_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_fraction + (1.0 - self.final_fraction) * cosine


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int,
                  total_steps: int | None = None,
                  final_fraction: float = 0.0) -> LambdaLR:
    """A :class:`~torch.optim.lr_scheduler.LambdaLR` with :class:`WarmupCosine`."""
    return LambdaLR(optimizer, WarmupCosine(warmup_steps, total_steps,
                                            final_fraction))
