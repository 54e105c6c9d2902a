"""Where and how a run computes: its device (``--device``) and its precision
(``--precision``), in one :class:`Placement` that every task and the
:class:`~pyg_metric_attn.training.Trainer` use to move models and batches and
to enter autocast.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor

Precision = Literal['fp32', 'bf16']
#: The precisions a run may ask for: ``'fp32'`` (float32 throughout) and
#: ``'bf16'`` (autocast to bfloat16; parameters, gradients and the optimiser
#: stay float32).
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: What ``--device`` accepts besides ``cuda:N``.
DEVICES = ('auto', 'cpu', 'cuda')


class DeviceUnavailableError(RuntimeError):
    """The device asked for is not on this machine."""


def _found() -> str:
    """The devices this machine has, in words."""
    if not torch.cuda.is_available():
        return (f'this machine has no CUDA device (torch {torch.__version__}), '
                f'only the CPU')
    count = torch.cuda.device_count()
    return f'this machine has {count} CUDA device(s): cuda:0-{count - 1}'


def resolve_device(spec: str | torch.device = 'auto') -> torch.device:
    """The device ``spec`` names: ``'auto'`` (CUDA where available, else the
    CPU), ``'cpu'``, ``'cuda'`` or ``'cuda:N'``.

    Raises :class:`DeviceUnavailableError` (one line naming CUDA and the
    devices found) where CUDA or GPU ``N`` is asked for and absent, and
    :class:`ValueError` for a name that is no device.
    """
    if isinstance(spec, str) and spec == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        device = torch.device(spec)
    except RuntimeError:
        device = None
    if device is None or device.type not in ('cpu', 'cuda'):
        raise ValueError(f"Unknown device '{spec}'; expected one of "
                         f"{', '.join(DEVICES)} or cuda:N")
    if device.type == 'cuda':
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(f"--device {spec} asks for CUDA, but "
                                         f"{_found()}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"--device {spec} asks for CUDA device "
                                         f"{device.index}, but {_found()}")
    return device


@dataclass(frozen=True)
class Placement:
    """A device and a precision.

    Args:
        device (torch.device, optional): Where models, batches and their
            computations live. (default: the CPU)
        precision (str, optional): ``'fp32'`` or ``'bf16'`` (autocast to
            bfloat16 around forward passes and losses). (default:
            :obj:`'fp32'`)
    """
    device: torch.device = field(default_factory=lambda: torch.device('cpu'))
    precision: Precision = 'fp32'

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"Unknown precision '{self.precision}'; expected "
                             f"one of {', '.join(PRECISIONS)}")

    @classmethod
    def of(cls, device: str | torch.device = 'auto',
           precision: str = 'fp32') -> Placement:
        """The placement of a ``--device`` and ``--precision`` (checked, see
        :func:`resolve_device`)."""
        return cls(resolve_device(device), precision)  # type: ignore[arg-type]

    @property
    def on_cuda(self) -> bool:
        return self.device.type == 'cuda'

    @property
    def pin_memory(self) -> bool:
        """Whether data loaders should pin their batches (CUDA only)."""
        return self.on_cuda

    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast of :attr:`precision` on :attr:`device` (nothing for
        ``'fp32'``)."""
        if self.precision == 'fp32':
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def move(self, obj: Any) -> Any:
        """``obj`` on :attr:`device`: a model (moved in place, as
        :meth:`torch.nn.Module.to` does), a tensor, anything else with
        ``.to`` (a PyG ``Data``/``Batch``: a moved copy, the original stays
        where it is), or tuples, lists and dicts of them; other values as
        they are. Copies to CUDA do not block (pin the source for them to
        overlap)."""
        if isinstance(obj, torch.nn.Module):
            return obj.to(self.device)
        if isinstance(obj, Tensor):
            return obj.to(self.device, non_blocking=self.on_cuda)
        if callable(getattr(obj, 'to', None)):  # PyG data: .to is in place
            return copy.copy(obj).to(self.device, non_blocking=self.on_cuda)
        if isinstance(obj, tuple) and hasattr(obj, '_fields'):  # named tuple
            return type(obj)(*(self.move(item) for item in obj))
        if isinstance(obj, (tuple, list)):
            return type(obj)(self.move(item) for item in obj)
        if isinstance(obj, Mapping):
            return {key: self.move(value) for key, value in obj.items()}
        return obj


def add_placement_arguments(parser: Any) -> None:
    """``--device`` and ``--precision`` on an argparse parser (or group); a
    command builds its :class:`Placement` with :meth:`Placement.of`."""
    parser.add_argument('--device', default='auto',
                        help="where to compute: auto (CUDA where available), "
                             "cpu, cuda or cuda:N (default: auto)")
    parser.add_argument('--precision', default='fp32', choices=PRECISIONS,
                        help='fp32, or bf16: autocast to bfloat16 (parameters '
                             'and optimiser stay float32; default: fp32)')
