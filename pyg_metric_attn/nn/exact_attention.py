r"""The exact correction of dense attention, decided on the device: the
``'checked'`` precision policy of :mod:`~pyg_metric_attn.nn.logits` without
a host synchronisation.

:func:`exact_attention_where` takes the output of the fused (expanded-form)
SDPA path and a boolean per softmax (batch element and head; from
:func:`~pyg_metric_attn.nn.logits.needs_exact`) and returns the fused output
where the flag is :obj:`False` and, where it is :obj:`True`, attention
computed exactly:

.. math::
    \mathrm{out}_i = \sum_j \mathrm{softmax}_j(s_{ij} + m_{ij})\, z_{ij}\, v_j,
    \qquad s_{ij} = -\|q_i - k_j\|^2 / t \ \ (\texttt{'metric'},
    \texttt{'l2'}), \quad q_i^\top k_j / (\sqrt{D}\, t) \ \ (\texttt{'dot'}),

in float64 from the direct differences (no cancellation, no overflow for
any finite float32 point), with the mask :math:`m` (a boolean or float
``attn_mask`` broadcastable to ``[..., L_q, L_k]``, and ``is_causal``:
:math:`j \le i`) and dropout :math:`z_{ij} = \mathrm{keep}_{ij} / (1 - p)`
drawn afresh for the flagged softmaxes (from ``seed``, not from the draw
the fused path made). Its backward passes the output's gradient to the
fused output where the flag is :obj:`False` and gives query, key, value, a
tensor time scale and a float mask the exact gradients of the flagged
softmaxes (zero elsewhere: the fused path's own backward adds theirs). A
query row that may attend to no key gets NaN (as SDPA) and no gradient. No
double backward.

It is one custom operator, ``pyg_metric_attn::exact_attention_where``, with
its backward ``pyg_metric_attn::exact_attention_where_backward``, fake
implementations and :func:`torch.library.register_autograd`, so
:func:`torch.compile` sees one graph (``fullgraph=True``); outside
compilation the same implementations run without the dispatcher
(:mod:`~pyg_metric_attn.nn.eager_operator`). Implementations:

* CPU tensors: a flag on the CPU is read without any device
  synchronisation, so the operator looks at the flags and computes the
  flagged softmaxes only, as explicit ``[L_q, L_k]`` float64 matrices; with
  no flag set it costs a copy of the output (forward) and zero gradients
  (backward).
* other devices: Triton kernels (:mod:`pyg_metric_attn.nn.triton.exact`)
  launched for every softmax, whose programs read their softmax's flag on
  the device and return at once where it is :obj:`False`; flagged ones run
  an online softmax over key blocks in float64 (:math:`O(L)` memory, the
  backward recomputing from the saved row log-sum-exp). Dropout draws a
  Philox stream from ``seed``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from pyg_metric_attn.nn.eager_operator import eager_autograd, operator_or_eager
from pyg_metric_attn.nn.logits import attention_logits, logit_scale


def exact_attention_where(needs_exact: Tensor, query: Tensor, key: Tensor,
                          value: Tensor, time_scale: Tensor,
                          attn_mask: Tensor | None, is_causal: bool,
                          dropout_p: float, fused_out: Tensor,
                          metric: str) -> Tensor:
    r"""``fused_out`` where ``needs_exact`` is :obj:`False`, exact attention
    where it is :obj:`True` (module docstring).

    Args:
        needs_exact (torch.Tensor): Boolean, broadcastable to the leading
            (batch) dimensions of ``fused_out``.
        query (torch.Tensor): ``[..., L_q, D]`` (centred, for the distance
            metrics).
        key (torch.Tensor): ``[..., L_k, D]``.
        value (torch.Tensor): ``[..., L_k, C]``.
        time_scale (torch.Tensor): float64, one value per softmax
            (:func:`~pyg_metric_attn.nn.logits.slice_time_scale`).
        attn_mask (torch.Tensor, optional): Boolean (:obj:`True` = may
            attend) or float, broadcastable to ``[..., L_q, L_k]``.
        is_causal (bool): Query :math:`i` attends to keys :math:`j \le i`.
        dropout_p (float): Dropout probability on the weights.
        fused_out (torch.Tensor): The fused path's output ``[..., L_q, C]``.
        metric (str): ``'metric'``, ``'l2'`` or ``'dot'``.
    """
    batch = fused_out.shape[:-2]
    seed = (torch.randint(2**31 - 1, (), device=query.device)
            if dropout_p > 0 else None)  # drawn on the device: no sync
    out, _ = run_exact_where(needs_exact.expand(batch), query, key, value,
                             time_scale, attn_mask, seed, fused_out, metric,
                             is_causal, float(dropout_p))
    return out


# ---------------------------------------------------------------- operators

def _triton_forward(needs_exact: Tensor, query: Tensor, key: Tensor,
                    value: Tensor, time_scale: Tensor, attn_mask: Tensor | None,
                    seed: Tensor | None, fused_out: Tensor, metric: str,
                    is_causal: bool, dropout_p: float) -> tuple[Tensor, Tensor]:
    """``(out, stats)``: the output and the float64 row state ``[..., L_q,
    2]`` of the flagged softmaxes (the largest logit and the log of the
    normaliser; undefined for the others)."""
    from pyg_metric_attn.nn.triton.exact import exact_forward
    return exact_forward(needs_exact, query, key, value, time_scale, attn_mask,
                         seed, fused_out, metric, is_causal, dropout_p)


exact_where = torch.library.custom_op('pyg_metric_attn::exact_attention_where',
                                      _triton_forward, mutates_args=())


@exact_where.register_fake
def _(needs_exact, query, key, value, time_scale, attn_mask, seed, fused_out,
      metric, is_causal, dropout_p):
    return (fused_out.new_empty(fused_out.shape),
            fused_out.new_empty((*fused_out.shape[:-1], 2), dtype=torch.float64))


def _triton_backward(grad_out: Tensor, needs_exact: Tensor, query: Tensor,
                     key: Tensor, value: Tensor, time_scale: Tensor,
                     attn_mask: Tensor | None, seed: Tensor | None, stats: Tensor,
                     metric: str, is_causal: bool, dropout_p: float,
                     need: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                Tensor]:
    """``(dq, dk, dv, dt, dmask)`` of the flagged softmaxes (zero
    elsewhere), each summed to its input's shape (contiguous); one not in ``need``
    (query, key, value, time scale, mask) comes back empty."""
    from pyg_metric_attn.nn.triton.exact import exact_backward
    return exact_backward(grad_out, needs_exact, query, key, value, time_scale,
                          attn_mask, seed, stats, metric, is_causal, dropout_p,
                          need)


exact_where_backward = torch.library.custom_op(
    'pyg_metric_attn::exact_attention_where_backward', _triton_backward,
    mutates_args=())


@exact_where_backward.register_fake
def _(grad_out, needs_exact, query, key, value, time_scale, attn_mask, seed,
      stats, metric, is_causal, dropout_p, need):
    return tuple(x.new_empty(x.shape) if wanted else query.new_empty(0)
                 for x, wanted in zip((query, key, value, time_scale, attn_mask),
                                      need, strict=True))


# ------------------------------------------------------- CPU implementation

@exact_where.register_kernel('cpu')
def _cpu_forward(needs_exact, query, key, value, time_scale, attn_mask, seed,
                 fused_out, metric, is_causal, dropout_p):
    out = fused_out.clone(memory_format=torch.contiguous_format)
    stats = fused_out.new_empty((*fused_out.shape[:-1], 2),
                                dtype=torch.float64)
    if not needs_exact.any():  # a CPU tensor: no device to wait for
        return out, stats
    flagged = _Flagged(needs_exact, query, key, value, time_scale, attn_mask)
    logits, _ = flagged.logits(metric, is_causal)
    weights, row_stats = _softmax(logits)
    dropped = weights * flagged.dropout(seed, dropout_p, logits.shape)
    out[needs_exact] = (dropped @ flagged.value).to(out.dtype)
    stats[needs_exact] = row_stats
    return out, stats


@exact_where_backward.register_kernel('cpu')
def _cpu_backward(grad_out, needs_exact, query, key, value, time_scale, attn_mask,
                  seed, stats, metric, is_causal, dropout_p, need):
    inputs = (query, key, value, time_scale, attn_mask)
    if not needs_exact.any():
        return tuple(x.new_zeros(x.shape) if wanted else query.new_empty(0)
                     for x, wanted in zip(inputs, need, strict=True))
    flagged = _Flagged(needs_exact, *inputs)
    logits, unmasked = flagged.logits(metric, is_causal)
    weights, row_stats = _softmax(logits)
    no_key = row_stats[..., :1] == float('-inf')
    weights = torch.where(no_key, 0, weights)  # NaN forward, no gradient
    keep = flagged.dropout(seed, dropout_p, logits.shape)
    dout = grad_out[needs_exact].double()
    grad_weights = (dout @ flagged.value.transpose(-1, -2)) * keep
    grad_logits = weights * (grad_weights - (weights * grad_weights).sum(
        -1, keepdim=True))
    q, k = flagged.query, flagged.key
    t = flagged.time_scale.view(-1, 1, 1)
    if metric == 'dot':
        scale = logit_scale(metric, q.size(-1), t)
        grad_q = grad_logits @ k * scale
        grad_k = grad_logits.transpose(-1, -2) @ q * scale
    else:  # d s / d q_i = -2 (q_i - k_j) / t, from the differences' sums
        grad_q = -2 / t * (grad_logits.sum(-1, keepdim=True) * q
                           - grad_logits @ k)
        grad_k = 2 / t * (grad_logits.transpose(-1, -2) @ q
                          - grad_logits.sum(-2).unsqueeze(-1) * k)
    grad_v = (weights * keep).transpose(-1, -2) @ dout
    # d s / d t = -s / t, on the entries that carry weight
    grad_t = -torch.where(weights > 0, grad_logits * unmasked, 0).sum(
        (-1, -2)) / flagged.time_scale
    grads = (grad_q, grad_k, grad_v, grad_t, grad_logits)
    return tuple(flagged.scatter(i, grad) if wanted else query.new_empty(0)
                 for i, (grad, wanted) in enumerate(zip(grads, need,
                                                        strict=True)))


def _softmax(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The softmax over the last dimension and the row state ``[..., 2]``
    (the largest logit :math:`m`, :math:`\\log l`, :math:`l = \\sum_j
    e^{s_j - m}`): a row that may attend to no key gets NaN and ``(-inf,
    -inf)``."""
    largest = logits.amax(-1, keepdim=True)
    exps = torch.exp(logits - largest)
    total = exps.sum(-1, keepdim=True)
    log_total = torch.where(largest == float('-inf'), float('-inf'),
                            total.log())
    return exps / total, torch.cat([largest, log_total], -1)


class _Flagged:
    """The flagged softmaxes' inputs (float64), stacked along one leading
    dimension, and the way back to each input's shape."""
    def __init__(self, needs_exact: Tensor, query: Tensor, key: Tensor,
                 value: Tensor, time_scale: Tensor, attn_mask: Tensor | None):
        self.needs_exact = needs_exact
        self.inputs = (query, key, value, time_scale, attn_mask)
        batch = needs_exact.shape
        num_queries, num_keys = query.size(-2), key.size(-2)
        self.shapes = ((*batch, num_queries, query.size(-1)),
                       (*batch, num_keys, key.size(-1)),
                       (*batch, num_keys, value.size(-1)), batch,
                       (*batch, num_queries, num_keys))
        self.query, self.key, self.value, self.time_scale, self.mask = (
            None if x is None else self._pick(x, shape)
            for x, shape in zip(self.inputs, self.shapes, strict=True))

    def _pick(self, x: Tensor, shape: tuple) -> Tensor:
        picked = x.expand(shape)[self.needs_exact]
        return picked if picked.dtype == torch.bool else picked.double()

    def logits(self, metric: str, is_causal: bool) -> tuple[Tensor, Tensor]:
        """``(masked, unmasked)`` float64 logits ``[n, L_q, L_k]``."""
        unmasked = attention_logits(self.query, self.key, metric,
                                    self.time_scale.view(-1, 1, 1))
        masked = unmasked
        if is_causal:
            causal = torch.ones(unmasked.shape[-2:], dtype=torch.bool).tril()
            masked = masked.masked_fill(~causal, float('-inf'))
        if self.mask is not None:
            masked = (masked.masked_fill(~self.mask, float('-inf'))
                      if self.mask.dtype == torch.bool else masked + self.mask)
        return masked, unmasked

    def dropout(self, seed: Tensor | None, dropout_p: float,
                shape: torch.Size) -> Tensor:
        """``z = keep / (1 - p)`` drawn from ``seed`` (1 without dropout)."""
        if dropout_p <= 0:
            return torch.ones((), dtype=torch.float64)
        generator = torch.Generator().manual_seed(int(seed))
        draw = torch.rand(shape, generator=generator, dtype=torch.float64)
        return torch.where(draw >= dropout_p, 1.0 / (1.0 - dropout_p)
                           if dropout_p < 1 else 0.0, 0.0)

    def scatter(self, index: int, grad: Tensor) -> Tensor:
        """A flagged gradient in place in zeros of the full batch, summed to
        the shape of input ``index``."""
        x = self.inputs[index]
        full = torch.zeros(self.shapes[index], dtype=torch.float64)
        full[self.needs_exact] = grad
        return full.sum_to_size(x.shape).to(x.dtype)


# ---------------------------------------------------------------- autograd

def _setup_context(ctx, inputs, output):
    (needs_exact, query, key, value, time_scale, attn_mask, seed, _, metric,
     is_causal, dropout_p) = inputs
    _, stats = output
    ctx.mark_non_differentiable(stats)
    ctx.save_for_backward(needs_exact, query, key, value, time_scale, attn_mask,
                          seed, stats)
    ctx.metric, ctx.is_causal, ctx.dropout_p = metric, is_causal, dropout_p


def _backward_by(run_backward):
    """The operator's backward, computed by ``run_backward`` (the backward
    operator, or its implementation for the inputs' device)."""
    def backward(ctx, grad_out, _grad_lse):
        (needs_exact, query, key, value, time_scale, attn_mask, seed,
         stats) = ctx.saved_tensors
        flags = needs_exact.view(*needs_exact.shape, 1, 1)
        grad_fused = (torch.where(flags, 0, grad_out)
                      if ctx.needs_input_grad[7] else None)
        need = [ctx.needs_input_grad[i] for i in (1, 2, 3, 4, 5)]
        grads = run_backward(grad_out.contiguous(), needs_exact, query, key,
                             value, time_scale, attn_mask, seed, stats,
                             ctx.metric, ctx.is_causal, ctx.dropout_p, need)
        grads = [grad if wanted else None
                 for grad, wanted in zip(grads, need, strict=True)]
        return None, *grads, None, grad_fused, None, None, None
    return backward


torch.library.register_autograd('pyg_metric_attn::exact_attention_where',
                                _backward_by(exact_where_backward),
                                setup_context=_setup_context)


def _forward_on_device(needs_exact: Tensor, *inputs) -> tuple[Tensor, Tensor]:
    """The forward implementation the dispatcher would pick: the CPU one
    for CPU tensors, the Triton one otherwise."""
    run = _cpu_forward if needs_exact.device.type == 'cpu' else _triton_forward
    return run(needs_exact, *inputs)


def _backward_on_device(grad_out: Tensor, *inputs) -> tuple[Tensor, ...]:
    """The backward implementation the dispatcher would pick."""
    run = _cpu_backward if grad_out.device.type == 'cpu' else _triton_backward
    return run(grad_out, *inputs)


#: The operators' code outside :func:`torch.compile`, without the dispatcher
#: (:mod:`~pyg_metric_attn.nn.eager_operator`).
ExactAttentionWhere = eager_autograd('ExactAttentionWhere', _forward_on_device,
                                     _setup_context,
                                     _backward_by(_backward_on_device))
#: ``pyg_metric_attn::exact_attention_where`` while compiling or tracing, else
#: :class:`ExactAttentionWhere`.
run_exact_where = operator_or_eager(exact_where, ExactAttentionWhere)
