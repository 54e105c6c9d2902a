r"""The heat-kernel time scale :math:`t` of :math:`\exp(-d / t)`."""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import Parameter


class TimeScale(torch.nn.Module):
    r"""The time :math:`t > 0` by which attention divides squared distances.

    A constant :math:`t` (the paper: :math:`t = 1`), or learned as
    :math:`t = \exp(s)` with :math:`s` initialised at :math:`\log t_0`, so it
    stays positive.

    Args:
        value (float): :math:`t_0`, the constant or the initial value.
        learn (bool): Learn :math:`t`.
    """
    def __init__(self, value: float = 1.0, learn: bool = False):
        super().__init__()
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ValueError(f"'time_scale' must be a positive number, got "
                             f"{value!r}")
        self.initial = float(value)
        self.learn = learn
        if learn:
            self.log_value = Parameter(torch.empty(()))
        else:
            self.register_parameter('log_value', None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.log_value is not None:
            with torch.no_grad():
                self.log_value.fill_(math.log(self.initial))

    def forward(self) -> Tensor | float:
        """:math:`t`: a float, or a 0-dim tensor when it is learned."""
        if self.log_value is not None:
            return self.log_value.exp()
        return self.initial

    def extra_repr(self) -> str:
        return f'{self.initial}, learn={self.learn}'
