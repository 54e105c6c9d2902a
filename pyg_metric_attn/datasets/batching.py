"""Length-bucketed mini-batches of token sequences."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def bucket_batches(lengths: Sequence[int], max_tokens: int,
                   generator: torch.Generator | None = None) -> list[list[int]]:
    """Group example indices into batches of similar length.

    Examples are sorted by length and cut into consecutive batches whose
    padded size (``longest * count``) stays within ``max_tokens`` (a longer
    example gets a batch of its own). With a ``generator``, examples of equal
    length are shuffled and so is the batch order; without one the batches
    are deterministic.
    """
    if max_tokens < 1:
        raise ValueError(f"'max_tokens' must be positive, got {max_tokens}")
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    if generator is None:
        order = lengths.argsort(stable=True)
    else:
        perm = torch.randperm(lengths.numel(), generator=generator)
        order = perm[lengths[perm].argsort(stable=True)]
    batches: list[list[int]] = []
    current: list[int] = []
    for index, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        # Sorted ascending: the newest example is the longest of its batch.
        if current and length * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    if generator is not None:
        batches = [batches[i] for i in
                   torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def pad_sequences(sequences: Sequence[Sequence[int]], pad_index: int,
                  bos_index: int | None = None,
                  eos_index: int | None = None) -> Tensor:
    """``[B, L]`` tensor of the sequences (optionally wrapped in BOS/EOS),
    right-padded with ``pad_index``."""
    rows = [([bos_index] if bos_index is not None else []) + list(seq)
            + ([eos_index] if eos_index is not None else []) for seq in sequences]
    out = torch.full((len(rows), max(map(len, rows), default=0)), pad_index,
                     dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out
