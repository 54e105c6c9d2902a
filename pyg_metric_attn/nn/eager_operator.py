r"""Custom operators for :func:`torch.compile`, entered without the dispatcher
otherwise.

The package's kernels (the sparse Triton attention, the dense augmentation,
the exact dense correction) are :func:`torch.library.custom_op` operators
with fake implementations and autograd formulas, so that
:func:`torch.compile` traces a layer as one graph with each operator one
opaque node. Entering an operator eagerly, though, runs the dispatcher's
Python path on every call (argument defaults, pytree flattening, the
autograd and backend wrappers, the backward operator's own dispatch): host
time that a small graph's GPU step, bound by the host, pays in full
(measured with ``benchmarks/host_dispatch.py``; docs/results/cpu.rst).

:func:`eager_autograd` makes a :class:`torch.autograd.Function` of an
operator's implementation and autograd formulas (``setup_context`` as
:func:`torch.library.register_autograd` takes it, a backward that calls the
backward's implementation), and :func:`operator_or_eager` calls the operator
while :func:`torch.compile` (or :func:`torch.jit.trace`) traces and that
Function otherwise: the same code computes both, so they agree.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def eager_autograd(name: str, forward: Callable[..., Any],
                   setup_context: Callable[[Any, tuple, Any], None],
                   backward: Callable[..., tuple]) -> type[torch.autograd.Function]:
    """A :class:`torch.autograd.Function` named ``name``: ``forward(*inputs)``
    then ``setup_context(ctx, inputs, output)``; ``backward(ctx, *grads)``
    returns one gradient per input (:obj:`None` for a list of tensors). No
    double backward."""
    def run_forward(ctx, *inputs):
        output = forward(*inputs)
        setup_context(ctx, inputs, output)
        return output

    return type(name, (torch.autograd.Function,), {
        '__doc__': f'``{name}``: the operator entered without the dispatcher '
                   f'({__name__}).',
        'forward': staticmethod(run_forward),
        'backward': staticmethod(
            torch.autograd.function.once_differentiable(backward)),
    })


def operator_or_eager(operator: Callable[..., Any],
                      function: type[torch.autograd.Function]
                      ) -> Callable[..., Any]:
    """``operator(*inputs)`` while :func:`torch.compile` or
    :func:`torch.jit.trace` traces (either records the operator as one
    node; a trace through the Function would record its torch ops and not
    its kernels), else ``function.apply(*inputs)`` (positional inputs
    only)."""
    def call(*inputs):
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return operator(*inputs)
        return function.apply(*inputs)
    call.__doc__ = (f'{getattr(operator, "__name__", "the operator")} under '
                    f'torch.compile and torch.jit.trace, else '
                    f'{function.__name__} (same code).')
    return call
