r"""The kernels as two custom operators with autograd, one graph to
:func:`torch.compile`.

``pyg_metric_attn::augment_queries_and_keys`` runs the statistics and the
augmentation kernels (and with a time scale, the ``'checked'`` policy's
decision: one more, small, launch),
``pyg_metric_attn::augment_queries_and_keys_backward`` the backward kernel;
:func:`torch.library.register_autograd` ties them. Both have fake
implementations, so :func:`torch.compile` traces through them
(``fullgraph=True``) and calls them as opaque operators; outside
compilation :func:`run_augment` runs the same code without the dispatcher
(:mod:`~pyg_metric_attn.nn.eager_operator`). They take ``[B, H,
L, D]`` points (any strides) and the attended keys as a boolean ``[B, H,
L_k]`` (or :obj:`None`); :mod:`..augmentation` brings other shapes to these.

Launch parameters: ``BLOCK_D``, ``BLOCK_W`` are ``D``, ``W`` rounded up to
a power of two (>= 16; masked), ``BLOCK_L`` keeps a tile at 4096 elements
(at least 16 rows). The statistics pass splits each ``(b, h)`` into ``S``
parts, enough for about ``TARGET_PROGRAMS`` programs in all and at most
``MAX_SPLITS`` (every augmentation program pools the ``S`` summaries). Both
``num_warps`` are Triton's default (4). Design choices, untuned on a GPU
(the globals below override them).

Memory: the outputs ``q'`` ``[B, H, L_q, W]`` and ``k'`` ``[B, H, L_k, W]``
(``k'`` is saved for the backward: SDPA saves it anyway) and ``[B H, S, D +
3]`` summaries in ``ACC``. No double backward.
"""
from __future__ import annotations

import torch
from torch import Tensor

from pyg_metric_attn.nn.eager_operator import eager_autograd, operator_or_eager
from pyg_metric_attn.nn.logits import LOGIT_ROUNDING_TOLERANCE, rounding_error_scale

#: Rows per tile; ``None``: 4096 elements per tile (at least 16 rows).
BLOCK_L: int | None = None
#: The statistics pass aims at this many programs in all ...
TARGET_PROGRAMS = 1024
#: ... with at most this many splits of one ``(b, h)``.
MAX_SPLITS = 32


def _kernels() -> dict:
    """The jit kernels (imported on first use: the import reads
    ``TRITON_INTERPRET``)."""
    from pyg_metric_attn.nn.augmentation.kernels import KERNELS
    return KERNELS


def _accumulator(dtype: torch.dtype):
    import triton.language as tl
    return tl.float64 if dtype == torch.float64 else tl.float32


def _block(width: int) -> int:
    import triton
    return max(16, triton.next_power_of_2(width))


def _rows(width: int) -> int:
    return BLOCK_L or max(16, 4096 // _block(width))


def _attended_strides(attended: Tensor | None) -> tuple[int, int, int]:
    return (0, 0, 0) if attended is None else attended.stride()


# ---------------------------------------------------------------- forward

def _forward(query: Tensor, key: Tensor, attended: Tensor | None, width: int,
             time_scale: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(q', k', needs_exact)``, ``[B, H, L_q, W]``, ``[B, H, L_k, W]`` and,
    with a ``time_scale`` (float64, broadcastable to ``[B, H]``), the
    boolean flags ``[B, H]`` of :func:`~pyg_metric_attn.nn.logits.needs_exact`
    for the centred points, the flagged softmaxes' ``q'``, ``k'`` zeroed
    (else an empty ``[0]``)."""
    import triton
    batch, heads, num_queries, dim = query.shape
    num_keys = key.size(2)
    query_aug = query.new_empty(batch, heads, num_queries, width)
    key_aug = key.new_empty(batch, heads, num_keys, width)
    check = time_scale is not None
    flags = torch.empty((batch, heads) if check else (0,), dtype=torch.bool,
                        device=query.device)
    pairs = batch * heads
    if pairs == 0 or num_queries + num_keys == 0:
        return query_aug, key_aug, flags.zero_()
    kernels = _kernels()
    acc = _accumulator(key.dtype)
    finfo = torch.finfo(key.dtype)
    mask = attended.view(torch.uint8) if attended is not None else key
    rows = _rows(dim)
    tiles = triton.cdiv(num_keys, rows)
    splits = max(1, min(tiles, MAX_SPLITS, triton.cdiv(TARGET_PROGRAMS, pairs)))
    tiles_per_split = triton.cdiv(tiles, splits)
    splits = max(1, triton.cdiv(tiles, max(tiles_per_split, 1)))
    summaries = torch.empty(pairs, splits, dim + 3, device=key.device,
                            dtype=torch.float64 if key.dtype == torch.float64
                            else torch.float32)
    has_mask = attended is not None
    norms = torch.empty(pairs, 2, device=key.device, dtype=torch.float32) \
        if check else summaries  # (a dummy pointer)
    kernels['augment_statistics'][(pairs, splits)](
        key, mask, summaries, norms, *key.stride(), *_attended_strides(attended),
        heads, num_keys, dim, tiles_per_split, HAS_MASK=has_mask, CHECK=check,
        ACC=acc, BLOCK_L=rows, BLOCK_D=_block(dim))
    rows = _rows(width)
    query_tiles = triton.cdiv(num_queries, rows)
    kernels['augment'][(pairs, query_tiles + triton.cdiv(num_keys, rows))](
        query, key, mask, summaries, query_aug, key_aug, norms, *query.stride(),
        *key.stride(), *_attended_strides(attended), heads, num_queries, num_keys,
        dim, width, splits, query_tiles, finfo.tiny, finfo.eps,
        HAS_MASK=has_mask, CHECK=check, ROUND=finfo.bits <= 16, ACC=acc,
        BLOCK_L=rows, BLOCK_W=_block(width),
        BLOCK_S=max(2, triton.next_power_of_2(splits)))
    if check:
        time_scale = time_scale.expand(batch, heads)  # strides 0 where shared
        kernels['augment_decide'][(pairs,)](
            norms, time_scale, flags.view(torch.uint8), query_aug, key_aug,
            *time_scale.stride(), heads, num_queries, num_keys, width,
            rounding_error_scale(query.dtype, dim), LOGIT_ROUNDING_TOLERANCE,
            BLOCK_L=rows, BLOCK_W=_block(width))
    return query_aug, key_aug, flags


augment = torch.library.custom_op('pyg_metric_attn::augment_queries_and_keys',
                                  _forward, mutates_args=())


@augment.register_fake
def _(query, key, attended, width, time_scale):
    return (query.new_empty(*query.shape[:3], width),
            key.new_empty(*key.shape[:3], width),
            query.new_empty(query.shape[:2] if time_scale is not None else (0,),
                            dtype=torch.bool))


# ---------------------------------------------------------------- backward

def _backward_kernel(grad_query_aug: Tensor, grad_key_aug: Tensor, key_aug: Tensor,
                     attended: Tensor | None, dim: int, need_query: bool,
                     need_key: bool) -> tuple[Tensor, Tensor]:
    """``(dq, dk)`` (contiguous ``[B, H, L, D]``) from the gradients of
    ``q'``, ``k'`` (any strides); one not needed comes back empty."""
    import triton
    batch, heads, num_keys, width = key_aug.shape
    num_queries = grad_query_aug.size(2)
    grad_query = grad_query_aug.new_empty(
        (batch, heads, num_queries, dim) if need_query else (0,))
    grad_key = key_aug.new_empty((batch, heads, num_keys, dim) if need_key else (0,))
    rows = _rows(width)
    query_tiles = triton.cdiv(num_queries, rows) if need_query else 0
    tiles = query_tiles + (triton.cdiv(num_keys, rows) if need_key else 0)
    if batch * heads == 0 or tiles == 0:
        return grad_query, grad_key
    mask = attended.view(torch.uint8) if attended is not None else key_aug
    _kernels()['augment_backward'][(batch * heads, tiles)](
        grad_query_aug, grad_key_aug, key_aug, mask, grad_query, grad_key,
        *grad_query_aug.stride(), *grad_key_aug.stride(), *key_aug.stride(),
        *_attended_strides(attended), heads, num_queries, num_keys, dim,
        query_tiles, HAS_MASK=attended is not None,
        ACC=_accumulator(key_aug.dtype), BLOCK_L=rows, BLOCK_W=_block(width))
    return grad_query, grad_key


augment_backward = torch.library.custom_op(
    'pyg_metric_attn::augment_queries_and_keys_backward', _backward_kernel,
    mutates_args=())

#: The operators' plain implementations, by operator (an op counter runs them
#: under its dispatch mode to count the ops inside).
IMPLEMENTATIONS = {
    'pyg_metric_attn.augment_queries_and_keys': _forward,
    'pyg_metric_attn.augment_queries_and_keys_backward': _backward_kernel,
}


@augment_backward.register_fake
def _(grad_query_aug, grad_key_aug, key_aug, attended, dim, need_query, need_key):
    batch, heads, num_keys, _ = key_aug.shape
    return (grad_query_aug.new_empty((batch, heads, grad_query_aug.size(2), dim)
                                     if need_query else (0,)),
            key_aug.new_empty((batch, heads, num_keys, dim) if need_key else (0,)))


# ---------------------------------------------------------------- autograd

def _setup_context(ctx, inputs, output):
    query, _, attended, _, _ = inputs
    ctx.mark_non_differentiable(output[2])
    ctx.save_for_backward(output[1], attended)
    ctx.dim = query.size(-1)


def _backward_by(run_backward):
    """The operator's backward, computed by ``run_backward`` (the backward
    operator, or its implementation)."""
    def backward(ctx, grad_query_aug, grad_key_aug, _grad_flags):
        key_aug, attended = ctx.saved_tensors
        need_query, need_key = ctx.needs_input_grad[:2]
        grad_query, grad_key = run_backward(
            grad_query_aug, grad_key_aug, key_aug, attended, ctx.dim,
            need_query, need_key)
        return (grad_query if need_query else None,
                grad_key if need_key else None, None, None, None)
    return backward


torch.library.register_autograd('pyg_metric_attn::augment_queries_and_keys',
                                _backward_by(augment_backward),
                                setup_context=_setup_context)

#: The operators' code outside :func:`torch.compile`, without the dispatcher
#: (:mod:`~pyg_metric_attn.nn.eager_operator`).
AugmentQueriesAndKeys = eager_autograd('AugmentQueriesAndKeys', _forward,
                                       _setup_context,
                                       _backward_by(_backward_kernel))
#: ``pyg_metric_attn::augment_queries_and_keys`` while compiling or tracing, else
#: :class:`AugmentQueriesAndKeys`.
run_augment = operator_or_eager(augment, AugmentQueriesAndKeys)
