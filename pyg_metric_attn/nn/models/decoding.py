r"""Batched autoregressive decoding for
:class:`~pyg_metric_attn.nn.models.MetricTransformer`: greedy search and beam
search with the GNMT length penalty
:math:`lp(n) = ((5 + n) / 6)^{\alpha}` (Wu et al. 2016).

Both return, per source sentence, the generated token ids without the
begin-of-sequence token and stop at (and drop) the end-of-sequence token.
The output length is capped at ``max_len_a * source_length + max_len_b``.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _max_steps(src: Tensor, pad_index: int, max_len_a: float,
               max_len_b: int) -> int:
    source_length = int((src != pad_index).sum(-1).max())
    return int(max_len_a * source_length + max_len_b)


def _strip(rows: Tensor, eos_index: int) -> list[list[int]]:
    """Token lists after BOS, cut at the first EOS."""
    out = []
    for row in rows[:, 1:].tolist():
        out.append(row[:row.index(eos_index)] if eos_index in row else row)
    return out


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, src: Tensor, bos_index: int,
                  eos_index: int, max_len_a: float = 1.5,
                  max_len_b: int = 10) -> list[list[int]]:
    """Pick the most likely next token until every sentence emitted EOS.

    Args:
        model: A :class:`~pyg_metric_attn.nn.models.MetricTransformer`.
        src (torch.Tensor): Padded source tokens ``[B, S]``.
        bos_index (int): Begin-of-sequence token.
        eos_index (int): End-of-sequence token.
    """
    memory, padding_mask = model.encode(src)
    tokens = src.new_full((src.size(0), 1), bos_index)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    cache = None
    for _ in range(_max_steps(src, model.pad_index, max_len_a, max_len_b)):
        state, cache = model.decoder_step(tokens[:, -1], memory, padding_mask,
                                          cache)
        logits = model.generator(state)
        next_token = logits.argmax(-1).masked_fill(finished, model.pad_index)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_index
        if bool(finished.all()):
            break
    return _strip(tokens, eos_index)


def length_penalty(length: Tensor, alpha: float) -> Tensor:
    r"""GNMT length penalty :math:`((5 + n) / 6)^{\alpha}`."""
    return ((5.0 + length.float()) / 6.0).pow(alpha)


@torch.no_grad()
def beam_search(model: torch.nn.Module, src: Tensor, bos_index: int,
                eos_index: int, beam_size: int = 4, alpha: float = 0.6,
                max_len_a: float = 1.5, max_len_b: int = 10) -> list[list[int]]:
    r"""Keep the ``beam_size`` prefixes of highest log-probability per
    sentence; finished hypotheses stay in the beam at their score. The result
    is the hypothesis with the best :math:`\log p / lp(n)` (``n`` counts the
    generated tokens including EOS).

    Args:
        model: A :class:`~pyg_metric_attn.nn.models.MetricTransformer`.
        src (torch.Tensor): Padded source tokens ``[B, S]``.
        bos_index (int): Begin-of-sequence token.
        eos_index (int): End-of-sequence token.
        beam_size (int): Hypotheses kept per sentence.
        alpha (float): Length penalty exponent (0 = none).
    """
    if beam_size < 1:
        raise ValueError(f"'beam_size' must be at least 1, got {beam_size}")
    batch, pad = src.size(0), model.pad_index
    memory, padding_mask = model.encode(src)
    memory = memory.repeat_interleave(beam_size, dim=0)
    padding_mask = padding_mask.repeat_interleave(beam_size, dim=0)
    tokens = src.new_full((batch * beam_size, 1), bos_index)
    scores = torch.full((batch, beam_size), float('-inf'), device=src.device)
    scores[:, 0] = 0.0  # all beams start as the same empty prefix
    finished = torch.zeros(batch * beam_size, dtype=torch.bool, device=src.device)
    lengths = torch.zeros(batch * beam_size, dtype=torch.long, device=src.device)
    offsets = torch.arange(batch, device=src.device)[:, None] * beam_size
    cache = None
    for _ in range(_max_steps(src, pad, max_len_a, max_len_b)):
        state, cache = model.decoder_step(tokens[:, -1], memory, padding_mask,
                                          cache)
        log_probs = torch.log_softmax(model.generator(state).float(), dim=-1)
        # A finished hypothesis continues with padding at no cost.
        log_probs[finished] = float('-inf')
        log_probs[finished, pad] = 0.0
        vocab = log_probs.size(-1)
        candidates = (scores.view(-1, 1) + log_probs).view(batch, -1)
        scores, index = candidates.topk(beam_size, dim=-1)
        parent = (offsets + torch.div(index, vocab, rounding_mode='floor')).view(-1)
        next_token = (index % vocab).view(-1)
        tokens = torch.cat([tokens[parent], next_token[:, None]], dim=1)
        cache = [layer_inputs[parent] for layer_inputs in cache]
        lengths = lengths[parent] + (~finished[parent]).long()
        finished = finished[parent] | (next_token == eos_index)
        if bool(finished.all()):
            break
    normalised = scores / length_penalty(lengths.view(batch, beam_size), alpha)
    best = offsets.view(-1) + normalised.argmax(-1)
    return _strip(tokens[best], eos_index)
