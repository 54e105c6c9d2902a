"""Random streams derived from a run's seed."""
from __future__ import annotations

import torch

#: A prime above any number of epochs: ``seed * EPOCH_STRIDE + epoch`` differs
#: for every ``(seed, epoch)`` pair with ``epoch < EPOCH_STRIDE``.
EPOCH_STRIDE = 1_000_003


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of epoch ``epoch`` of the run seeded ``seed`` (e.g. the
    order of its training batches): the same for the same pair, so a resumed
    run sees the batches it would have seen, and independent of the global
    random state."""
    return torch.Generator().manual_seed(seed * EPOCH_STRIDE + epoch)
