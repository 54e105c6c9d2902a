"""Evaluation mode for a block of code, restoring the module's mode after."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run the block with ``model`` in eval mode and without gradients; on
    leaving (also by an exception) the model is back in the mode it was in.

    .. code-block:: python

        with eval_mode(model):
            logits = model(x)
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)
