r"""Trained models shipped with the package, each beside its model card.

A shipped model is two files in this folder: ``NAME.pt`` (its weights, a
``state_dict``) and ``NAME.json`` (its card: the architecture, the
preprocessing it expects, how it was trained and how well it does, and the
SHA-256 of ``NAME.pt``). Loading reads both from disk, checks the weights
against the card's SHA-256 and never touches the network.

.. code-block:: python

    from pyg_metric_attn.pretrained import human_seg

    segmenter = human_seg()           # a MeshSegmenter, in eval mode
    labels = segmenter.segment(pos, face)   # a part label per face
    segmenter.classes                 # ('head', 'hand', ...)
    segmenter.card['metrics']         # its test accuracy, ...
"""
from pyg_metric_attn.pretrained.card import (
    PRETRAINED_DIR,
    load_pretrained,
    read_card,
    write_pretrained,
)
from pyg_metric_attn.pretrained.segmenter import MeshSegmenter, output_names


def human_seg(device: str = 'cpu') -> MeshSegmenter:
    """The shipped human-body segmentation model (MeshCNN's human_seg
    parts: head, hand, lower arm, upper arm, torso, upper leg, lower leg,
    foot), a :class:`MeshSegmenter` in eval mode on ``device``, with the
    preprocessing it expects; its card (data, command, commit, accuracy on
    the test meshes and on remeshed and deformed copies of them) is
    ``.card``."""
    return load_pretrained('human_seg', device=device)


__all__ = ['MeshSegmenter', 'PRETRAINED_DIR', 'human_seg', 'load_pretrained',
           'output_names', 'read_card', 'write_pretrained']
