r"""Dense (all-pairs) metric-attention on top of
:func:`torch.nn.functional.scaled_dot_product_attention`.

For ``'metric'`` and ``'l2'`` the logits are :math:`-\|q_i - k_j\|^2 / t`.
Expanding the square, :math:`\|q_i\|^2` is constant along a softmax row and
drops out, so

.. math::
    \mathrm{softmax}_j\!\left(-\|q_i - k_j\|^2 / t\right)
    = \mathrm{softmax}_j\!\left((2\, q_i^\top k_j - \|k_j\|^2) / t\right),

which is SDPA with ``scale = 2/t``, fed in one of two ways:

* **key bias**: an additive per-key bias :math:`-\|k_j\|^2/t` as a broadcast
  ``attn_mask`` of shape ``[..., 1, L_k]``;
* **augmented**: plain SDPA on :math:`q' = [q, -\tfrac12]`,
  :math:`k' = [k, \|k\|^2]` (values padded to the same head width).

Fused SDPA kernels then apply and no ``L_q x L_k`` score matrix is stored.
Which form, measured on CPU (torch 2.13; ``BENCHMARKS.md``): the flash kernel
takes a mask, but a mask that requires grad drops SDPA to its quadratic math
kernel, its backward is 2-3x slower with any mask, and ``is_causal`` cannot be
combined with a mask. So the key bias serves inference (no gradient, not
causal), where it runs at SDPA-dot speed; training and causal calls take the
augmented form, whose flash backward also gives the keys their gradient. Off
CPU the augmented form always runs (GPU flash kernels take no mask), its head
width padded to a multiple of 8; that choice is untimed (no GPU was
available). ``q`` and ``k``
are first centred by a common vector (distances are translation invariant),
which keeps the expanded form free of cancellation when points sit far from
the origin. ``'dot'`` is plain SDPA with ``scale = 1/(sqrt(D) t)``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_metric_attn.nn.pseudo_metric import check_metric


def attention_logits(query: Tensor, key: Tensor, metric: str,
                     time_scale: float | Tensor = 1.0) -> Tensor:
    r"""The explicit ``[..., L_q, L_k]`` logit matrix (no masking)."""
    check_metric(metric)
    if metric == 'dot':
        return query @ key.transpose(-1, -2) / (math.sqrt(query.size(-1))
                                                 * time_scale)
    centre = key.mean(dim=-2, keepdim=True)
    return -torch.cdist(query - centre, key - centre).square() / time_scale


def centred(query: Tensor, key: Tensor, dim: int = -2) -> tuple[Tensor, Tensor]:
    """Shift queries and keys by the mean key along ``dim`` (a constant for
    autograd): distances are unchanged, the expanded form
    ``|q|^2 - 2 q.k + |k|^2`` loses no precision to large offsets."""
    if key.size(dim) == 0:
        return query, key
    centre = key.detach().mean(dim=dim, keepdim=True)
    return query - centre, key - centre


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

    Returns:
        ``(output [..., L_q, C], weights or None)``. A query row that may
        attend to no key gets NaN, as in SDPA.
    """
    check_metric(metric)
    if need_weights:
        return _explicit_attention(query, key, value, metric, time_scale,
                                   attn_mask, is_causal, dropout_p)
    if metric == 'dot':
        scale = 1.0 / (math.sqrt(query.size(-1)) * time_scale)
        return _sdpa(query, key, value, scale, attn_mask, is_causal,
                     dropout_p), None

    query, key = centred(query, key)
    if _needs_augmented_form(query, key, value, time_scale, is_causal):
        return _augmented_sdpa(query, key, value, time_scale, attn_mask,
                               is_causal, dropout_p), None
    return _key_bias_sdpa(query, key, value, time_scale, attn_mask,
                          dropout_p), None


def _needs_augmented_form(query: Tensor, key: Tensor, value: Tensor,
                          time_scale: float | Tensor, is_causal: bool) -> bool:
    """Whether the augmented form is the faster fused one (see module
    docstring): off CPU, causal, or whenever a gradient is needed."""
    if key.device.type != 'cpu' or is_causal:
        return True
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad
        for t in (query, key, value, time_scale))


def _key_bias_sdpa(query: Tensor, key: Tensor, value: Tensor,
                   time_scale: float | Tensor, attn_mask: Tensor | None,
                   dropout_p: float) -> Tensor:
    r"""SDPA with ``scale = 2/t`` and the key bias :math:`-\|k_j\|^2/t`
    added to ``attn_mask``."""
    key_bias = -key.square().sum(-1).unsqueeze(-2) / time_scale  # [..., 1, L_k]
    mask = _combine_masks(key_bias, attn_mask, False, query.size(-2),
                          key.size(-2))
    return _sdpa(query, key, value, 2.0 / time_scale, mask, False, dropout_p)


def _augmented_sdpa(query: Tensor, key: Tensor, value: Tensor,
                    time_scale: float | Tensor, attn_mask: Tensor | None,
                    is_causal: bool, dropout_p: float) -> Tensor:
    r"""Plain SDPA on :math:`q' = [q, -\tfrac12]`, :math:`k' = [k,
    \|k\|^2]` with ``scale = 2/t``; query, key and value are zero-padded to
    one head width (the fused kernels need equal widths)."""
    width = max(query.size(-1) + 1, value.size(-1))
    if query.device.type != 'cpu':
        width = -(-width // 8) * 8
    query = torch.cat([query, query.new_full((*query.shape[:-1], 1), -0.5)], -1)
    key = torch.cat([key, key.square().sum(-1, keepdim=True)], -1)
    padded = [F.pad(t, (0, width - t.size(-1))) for t in (query, key, value)]
    out = _sdpa(*padded, 2.0 / time_scale, attn_mask, is_causal, dropout_p)
    return out[..., :value.size(-1)]


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
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                          dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)


def _combine_masks(key_bias: Tensor, attn_mask: Tensor | None, is_causal: bool,
                   num_queries: int, num_keys: int) -> Tensor:
    """Add the key bias to the user's mask (and the causal mask) as floats."""
    mask = key_bias
    blocked = torch.tensor(float('-inf'), dtype=mask.dtype, device=mask.device)
    if is_causal:
        causal = torch.ones(num_queries, num_keys, dtype=torch.bool,
                            device=mask.device).tril()
        mask = torch.where(causal, mask, blocked)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = torch.where(attn_mask, mask, blocked)
        else:
            mask = mask + attn_mask.to(mask.dtype)
    return mask


def _explicit_attention(query: Tensor, key: Tensor, value: Tensor, metric: str,
                        time_scale: float | Tensor, attn_mask: Tensor | None,
                        is_causal: bool, dropout_p: float) -> tuple[Tensor, Tensor]:
    logits = attention_logits(query, key, metric, time_scale)
    zeros = logits.new_zeros(())
    logits = logits + _combine_masks(zeros, attn_mask, is_causal, query.size(-2),
                                     key.size(-2))
    weights = torch.softmax(logits, dim=-1)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return dropped @ value, weights
