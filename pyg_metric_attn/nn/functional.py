r"""Dense (all-pairs) metric-attention on top of
:func:`torch.nn.functional.scaled_dot_product_attention`.

For ``'metric'`` and ``'l2'`` the logits :math:`-\|q_i - k_j\|^2 / t` enter
the softmax in their expanded form :math:`(2\, q_i^\top k_j - \|k_j\|^2) / t`
(:mod:`~pyg_metric_attn.nn.logits`), SDPA with ``scale = 2/t`` fed in one
of two ways:

* **key bias**: an additive per-key bias :math:`-\|k_j\|^2/t` as a broadcast
  ``attn_mask`` of shape ``[..., 1, L_k]``;
* **augmented**: plain SDPA on :math:`q' = [q, -\tfrac12]`,
  :math:`k' = [k, \|k\|^2]` (values padded to the same head width).

Fused SDPA kernels then apply and no ``L_q x L_k`` score matrix is stored.
Which form, measured on CPU (torch 2.13; docs/results/cpu.rst): the flash kernel
takes a mask, but a mask that requires grad drops SDPA to its quadratic math
kernel, its backward is 2-3x slower with any mask, and ``is_causal`` cannot be
combined with a mask. So the key bias serves inference (no gradient, not
causal, metric width equal to the value width), where it runs at SDPA-dot
speed; training and causal calls, and metric widths other than the value
width, take the augmented form, whose flash backward also gives the keys
their gradient. Off CPU the augmented form always runs (GPU flash kernels
take no mask). Its
width is the metric width plus one; query, key and value are zero-padded to
one width (a multiple of 8 off CPU), so a metric width one less than the
value width pads nothing and runs the kernel of the value width: on an H100
(bf16, issue 27) a metric width of 64 (65, padded to 72, ran cuDNN's 128-wide
kernel) cost 1.7-3.3x SDPA-dot fwd+bwd at L = 16384-1024, a metric width of
63 1.09-1.89x. :class:`~pyg_metric_attn.nn.MetricMultiheadAttention`
therefore defaults to it. The augmentation (centring, norm, concatenation)
runs in Triton on CUDA (two launches forward, one backward, and with
``precision='checked'`` one more, small, forward launch that makes the
exact correction's decision; one custom operator to :func:`torch.compile`:
:mod:`~pyg_metric_attn.nn.augmentation`) and as plain tensor ops on CPU.
``'dot'`` is plain SDPA with ``scale = 1/(sqrt(D) t)``.

Precision. Queries and keys are centred on the mean of the keys of their own
softmax (each batch element and head, counting only keys that some query
may attend to and that are finite); keys no query may attend to are
zeroed. Whether the expanded form is then accurate enough, and what runs
where it is not, is the policy ``precision`` of
:mod:`~pyg_metric_attn.nn.logits`: ``'checked'`` (decided per softmax on the
device, on CUDA inside the augmentation; the fused path, then
:func:`~pyg_metric_attn.nn.exact_attention.exact_attention_where` makes the
flagged softmaxes exact, from the points as given) or ``'fast'`` (no
check, no correction). Neither synchronises, and both compile as one
graph under :func:`torch.compile`.

Denormals. The very negative distance logits make the softmax produce
denormal floats, which are slow on x86 CPUs, so on CPU every SDPA call (and
its backward) runs with denormals flushed to zero on the calling thread and
all intra-op worker threads (:mod:`pyg_metric_attn.utils.denormals`).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_metric_attn.nn.augmentation import (
    augmented_queries_and_keys,
    checked_augmentation,
    runs_fused,
)
from pyg_metric_attn.nn.exact_attention import exact_attention_where
from pyg_metric_attn.nn.logits import (
    attention_logits,
    centred,
    check_precision,
    logit_scale,
    needs_exact,
    slice_time_scale,
)
from pyg_metric_attn.nn.normalization import (
    check_normalization,
    normalize_dense_logits,
)
from pyg_metric_attn.nn.pseudo_metric import check_metric
from pyg_metric_attn.utils.denormals import denormals_flushed, flush_in_backward


def dense_metric_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    metric: str = 'metric',
    time_scale: float | Tensor = 1.0,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    normalization: str = 'row',
    sinkhorn_iterations: int = 3,
    precision: str = 'checked',
) -> tuple[Tensor, Tensor | None]:
    r"""All-pairs attention ``softmax(logits + mask) @ value``.

    Args:
        query (torch.Tensor): Embedded queries ``[..., L_q, D]`` (for
            ``'metric'``/``'l2'``: :math:`\phi` of the destination points).
        key (torch.Tensor): Embedded keys ``[..., L_k, D]``.
        value (torch.Tensor): Values ``[..., L_k, C]``.
        metric (str): ``'metric'``, ``'l2'`` (distance logits) or ``'dot'``.
        time_scale (float or torch.Tensor): The time scale :math:`t`.
        attn_mask (torch.Tensor, optional): SDPA convention: a boolean mask
            (:obj:`True` = may attend) or a float mask added to the logits,
            broadcastable to ``[..., L_q, L_k]``.
        is_causal (bool): Query :math:`i` attends to keys :math:`j \le i`.
        dropout_p (float): Dropout probability on the attention weights.
        need_weights (bool): Also return the ``[..., L_q, L_k]`` weights (runs
            an explicit, non-fused computation).
        normalization (str): ``'row'`` (the softmax over keys), or
            ``'column'``, ``'sinkhorn'``, ``'global'``
            (:func:`~pyg_metric_attn.nn.normalization.normalize_dense_logits`),
            which run on the explicit ``[..., L_q, L_k]`` score matrix
            (:math:`O(L_q L_k)` memory) and leave masked entries out of
            every normalisation.
        sinkhorn_iterations (int): Column-then-row steps of ``'sinkhorn'``.
        precision (str): ``'checked'`` (exact float64 attention in each
            softmax whose fused logits would round by more than the
            tolerance, decided on the device; explicit paths in float64)
            or ``'fast'`` (no check, explicit paths in float32); neither
            synchronises. See :mod:`~pyg_metric_attn.nn.logits`.

    Returns:
        ``(output [..., L_q, C], weights or None)``. A query row that may
        attend to no key gets NaN, as in SDPA (weights 0 with the other
        normalisations).
    """
    check_metric(metric)
    check_normalization(normalization, sinkhorn_iterations)
    check_precision(precision)
    checked = precision == 'checked'
    explicit = need_weights or normalization != 'row'
    attended = _attended_keys(attn_mask)
    if metric != 'dot' and not explicit and runs_fused(query, key):
        return _augmented_attention(query, key, value, metric, time_scale,
                                    attn_mask, attended, is_causal, dropout_p,
                                    checked), None
    if metric != 'dot':
        query, key = _centred_points(query, key, value, attended)
    if explicit:
        out, weights = _explicit_attention(query, key, value, metric, time_scale,
                                           attn_mask, is_causal, dropout_p, checked,
                                           normalization, sinkhorn_iterations)
        return out, weights if need_weights else None
    exact = needs_exact(query, key, metric, time_scale) if checked else None
    out = _fused_attention(*_fused_points(exact, query, key, value, time_scale),
                           value, metric, time_scale, attn_mask, is_causal,
                           dropout_p)
    if exact is not None:
        out = exact_attention_where(
            exact, query, key, value, slice_time_scale(time_scale, query.device),
            attn_mask, is_causal, dropout_p, out, metric)
    return out, None


def _augmented_attention(query: Tensor, key: Tensor, value: Tensor, metric: str,
                         time_scale: float | Tensor, attn_mask: Tensor | None,
                         attended: Tensor | None, is_causal: bool,
                         dropout_p: float, checked: bool) -> Tensor:
    """The distance metrics' row softmax where the augmentation runs fused
    (:func:`~pyg_metric_attn.nn.augmentation.runs_fused`): one operator
    centres and augments the points and, ``checked``, decides which
    softmaxes need the exact correction (zeroing their augmented points for
    the fused attention); the correction reads the points as given (exact
    float64 differences need no centring), with the keys no query may
    attend to zeroed as the augmentation zeroes them."""
    width = _augmented_width(query, value)
    if not checked:
        return _augmented_sdpa(query, key, value, time_scale, attn_mask, is_causal,
                               dropout_p, augmented_queries_and_keys(
                                   query, key, attended, width))
    slices = slice_time_scale(time_scale, query.device)
    query_aug, key_aug, exact = checked_augmentation(query, key, attended, width,
                                                     slices)
    out = _augmented_sdpa(query, key, value, time_scale, attn_mask, is_causal,
                          dropout_p, (query_aug, key_aug))
    if attended is not None:
        key = torch.where(attended, key, 0)
    return exact_attention_where(exact, query, key, value, slices, attn_mask,
                                 is_causal, dropout_p, out, metric)


def _fused_attention(query: Tensor, key: Tensor, value: Tensor, metric: str,
                     time_scale: float | Tensor, attn_mask: Tensor | None,
                     is_causal: bool, dropout_p: float) -> Tensor:
    """The fused SDPA path for centred points: plain SDPA for ``'dot'``,
    else the augmented form or the key bias (see the module docstring)."""
    if metric == 'dot':
        scale = logit_scale(metric, query.size(-1), time_scale)
        return _sdpa(query, key, value, scale, attn_mask, is_causal, dropout_p)
    if _needs_augmented_form(query, key, value, time_scale, is_causal):
        return _augmented_sdpa(query, key, value, time_scale, attn_mask,
                               is_causal, dropout_p)
    return _key_bias_sdpa(query, key, value, time_scale, attn_mask, dropout_p)


def _fused_points(exact: Tensor | None, query: Tensor, key: Tensor,
                  value: Tensor, time_scale: float | Tensor
                  ) -> tuple[Tensor, Tensor]:
    """Query and key (or their augmented forms) for the fused path: with a
    gradient to compute, zero in the softmaxes the exact path takes over
    (their fused output is replaced and gets no gradient, but its backward
    must stay finite: a huge or infinite point would make it NaN, and NaN
    times a zero gradient is NaN)."""
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad
        for t in (query, key, value, time_scale))
    if exact is None or not needs_grad:
        return query, key
    flagged = exact.view(*exact.shape, 1, 1)
    return torch.where(flagged, 0, query), torch.where(flagged, 0, key)


def _attended_keys(attn_mask: Tensor | None) -> Tensor | None:
    """The keys some query may attend to, ``[..., L_k, 1]`` (None: all)."""
    if attn_mask is None:
        return None
    allowed = (attn_mask if attn_mask.dtype == torch.bool
               else attn_mask > float('-inf'))
    if allowed.dim() > 1:
        allowed = allowed.any(-2)
    return allowed.unsqueeze(-1)


def _centred_points(query: Tensor, key: Tensor, value: Tensor,
                    attended: Tensor | None) -> tuple[Tensor, Tensor]:
    """Queries and keys centred (:func:`centred`; keys no query may attend
    to zeroed): where the augmentation runs fused
    (:func:`~pyg_metric_attn.nn.augmentation.runs_fused`) the first ``D``
    columns of the augmented points it writes, else by torch ops."""
    if runs_fused(query, key):
        query_aug, key_aug = augmented_queries_and_keys(
            query, key, attended, _augmented_width(query, value))
        dim = query.size(-1)
        return query_aug[..., :dim], key_aug[..., :dim]
    query, key = centred(query, key, mask=attended)
    if attended is not None:
        key = torch.where(attended, key, 0)
    return query, key


def _needs_augmented_form(query: Tensor, key: Tensor, value: Tensor,
                          time_scale: float | Tensor, is_causal: bool) -> bool:
    """Whether the augmented form is the faster fused one (see module
    docstring): off CPU, causal, whenever a gradient is needed, or where
    the metric width differs from the value width (the CPU flash kernel
    needs one width for query, key and value; the key bias would get the
    quadratic math kernel)."""
    if (key.device.type != 'cpu' or is_causal
            or query.size(-1) != value.size(-1)):
        return True
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad
        for t in (query, key, value, time_scale))


def _key_bias_sdpa(query: Tensor, key: Tensor, value: Tensor,
                   time_scale: float | Tensor, attn_mask: Tensor | None,
                   dropout_p: float) -> Tensor:
    r"""SDPA with ``scale = 2/t`` and the key bias :math:`-\|k_j\|^2/t`
    (:func:`_key_norms`) added to ``attn_mask``."""
    key_bias = -_key_norms(key).transpose(-1, -2) / time_scale  # [..., 1, L_k]
    key_bias = key_bias.to(key.dtype)
    mask = _combine_masks(key_bias, attn_mask, False, query.size(-2),
                          key.size(-2))
    return _sdpa(query, key, value, logit_scale('metric', 0, time_scale), mask,
                 False, dropout_p)


def _augmented_sdpa(query: Tensor, key: Tensor, value: Tensor,
                    time_scale: float | Tensor, attn_mask: Tensor | None,
                    is_causal: bool, dropout_p: float,
                    augmented: tuple[Tensor, Tensor] | None = None) -> Tensor:
    r"""Plain SDPA on :math:`q' = [q, -\tfrac12]`, :math:`k' = [k,
    \|k\|^2]` (:func:`_key_norms`; or ``augmented``, already written) with
    ``scale = 2/t``; query, key and value are zero-padded to one head width
    (:func:`_augmented_width`)."""
    width = _augmented_width(query, value)
    if augmented is None:
        augmented = (
            torch.cat([query, query.new_full((*query.shape[:-1], 1), -0.5)], -1),
            torch.cat([key, _key_norms(key).to(key.dtype)], -1))
    padded = [t if t.size(-1) == width else F.pad(t, (0, width - t.size(-1)))
              for t in (*augmented, value)]  # (F.pad would copy even by 0)
    out = _sdpa(*padded, logit_scale('metric', 0, time_scale), attn_mask,
                is_causal, dropout_p)
    return out[..., :value.size(-1)]


def _augmented_width(query: Tensor, value: Tensor) -> int:
    """The head width of the augmented form: the metric width plus one or
    the value width, whichever is larger (the fused kernels need equal
    widths: none is padded where the metric width is one less than the
    value width, as in
    :class:`~pyg_metric_attn.nn.dense.multihead.MetricMultiheadAttention`),
    off CPU rounded up to a multiple of 8."""
    width = max(query.size(-1) + 1, value.size(-1))
    return width if query.device.type == 'cpu' else -(-width // 8) * 8


def _key_norms(key: Tensor) -> Tensor:
    r"""The key term :math:`\|k_j\|^2` ``[..., L_k, 1]``, summed in at least
    float32 and shifted by the mean over the keys of its finite values (a
    constant along each softmax row, so the weights do not change): the
    shifted terms are smaller and round less when they enter a low-precision
    SDPA (in bfloat16 about 3x less relative error at :math:`t = 1`)."""
    norms = torch.linalg.vector_norm(
        key, dim=-1, keepdim=True,
        dtype=torch.promote_types(key.dtype, torch.float32)).square()
    finite = norms.detach().isfinite()
    # Divide before summing: no overflow.
    shift = torch.where(finite, norms.detach() / key.size(-2), 0).sum(
        -2, keepdim=True)
    return norms - shift


def _sdpa(query: Tensor, key: Tensor, value: Tensor, scale: float | Tensor,
          attn_mask: Tensor | None, is_causal: bool, dropout_p: float) -> Tensor:
    """SDPA with a (possibly learned) ``scale`` and both a mask and
    ``is_causal`` allowed."""
    if is_causal and attn_mask is not None:  # SDPA takes one or the other
        attn_mask = _combine_masks(query.new_zeros(()), attn_mask, True,
                                   query.size(-2), key.size(-2))
        is_causal = False
    if isinstance(scale, Tensor):
        # SDPA takes a float scale: fold a learned t into the query instead.
        query, scale = query * scale, 1.0
    flush = query.device.type == 'cpu' and not torch.compiler.is_compiling()
    with denormals_flushed(flush):
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
            is_causal=is_causal, scale=scale)
    return flush_in_backward(out) if flush else out


def merge_masks(masks: Sequence[Tensor | None],
                dtype: torch.dtype) -> Tensor | None:
    """SDPA masks (boolean: :obj:`True` = may attend; float: added to the
    logits) as one, broadcast together: boolean where all are, else float
    (``dtype``) with ``-inf`` where a boolean mask blocks; :obj:`None`
    without any mask."""
    masks = [mask for mask in masks if mask is not None]
    if not masks:
        return None
    if all(mask.dtype == torch.bool for mask in masks):
        allowed = masks[0]
        for mask in masks[1:]:
            allowed = allowed & mask
        return allowed
    total = torch.zeros((), dtype=dtype, device=masks[0].device)
    # (a fill on the device: torch.tensor would copy from the host and sync)
    blocked = torch.full((), float('-inf'), dtype=dtype, device=total.device)
    for mask in masks:
        total = (torch.where(mask, total, blocked) if mask.dtype == torch.bool
                 else total + mask.to(dtype))
    return total


def _combine_masks(key_bias: Tensor, attn_mask: Tensor | None, is_causal: bool,
                   num_queries: int, num_keys: int) -> Tensor:
    """Add the key bias to the user's mask (and the causal mask) as floats."""
    causal = (torch.ones(num_queries, num_keys, dtype=torch.bool,
                         device=key_bias.device).tril() if is_causal else None)
    return merge_masks([key_bias, causal, attn_mask], key_bias.dtype)


def _explicit_attention(query: Tensor, key: Tensor, value: Tensor, metric: str,
                        time_scale: float | Tensor, attn_mask: Tensor | None,
                        is_causal: bool, dropout_p: float, exact: bool,
                        normalization: str = 'row',
                        sinkhorn_iterations: int = 3) -> tuple[Tensor, Tensor]:
    """Explicit logits and their normalisation (the softmax for ``'row'``),
    in float64 where ``exact`` (else in at least float32); output and weights
    in the input dtypes."""
    dtype = (torch.float64 if exact
             else torch.promote_types(query.dtype, torch.float32))
    logits = attention_logits(query.to(dtype), key.to(dtype), metric, time_scale)
    zeros = logits.new_zeros(())
    logits = logits + _combine_masks(zeros, attn_mask, is_causal, query.size(-2),
                                     key.size(-2))
    weights = normalize_dense_logits(logits, normalization, sinkhorn_iterations)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return (dropped @ value.to(dtype)).to(value.dtype), weights.to(query.dtype)
