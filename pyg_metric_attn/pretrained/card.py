r"""Shipped models on disk: the weights ``NAME.pt`` and the card ``NAME.json``
that describes them (format :data:`FORMAT_VERSION`), written together and
read back with the weights checked against the card's SHA-256."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pyg_metric_attn.nn.models import (
    DiffusionNet,
    DiffusionNetConfig,
    MetricMeshFormer,
    MetricMeshFormerConfig,
)
from pyg_metric_attn.pretrained.segmenter import MeshSegmenter
from pyg_metric_attn.transforms.mesh_preprocessing import MeshPreprocessing
from pyg_metric_attn.utils.io import (
    CorruptFileError,
    atomic_write_bytes,
    atomic_write_json,
)

#: The folder of the shipped models (package data).
PRETRAINED_DIR = Path(__file__).resolve().parent
#: The card format this version writes and reads.
FORMAT_VERSION = 1
#: The model classes a card may name, with their architecture configs.
MODEL_CLASSES = {'MetricMeshFormer': (MetricMeshFormer, MetricMeshFormerConfig),
                 'DiffusionNet': (DiffusionNet, DiffusionNetConfig)}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_card(name: str, folder: str | Path | None = None) -> dict[str, Any]:
    """The card ``NAME.json`` of a shipped model (in ``folder``, default
    :data:`PRETRAINED_DIR`)."""
    folder = Path(folder or PRETRAINED_DIR)
    path = folder / f'{name}.json'
    if not path.is_file():
        shipped = sorted(p.stem for p in folder.glob('*.json'))
        raise FileNotFoundError(f"No shipped model '{name}' in '{folder}' "
                                f"(shipped: {shipped or 'none'})")
    card = json.loads(path.read_text())
    version = card.get('format_version')
    if version != FORMAT_VERSION:
        raise ValueError(f"'{path}' is a model card of format {version!r}; this "
                         f"pyg-metric-attn reads format {FORMAT_VERSION}: "
                         f"install the version that shipped it")
    return card


def load_pretrained(name: str, folder: str | Path | None = None,
                    device: str | torch.device = 'cpu') -> MeshSegmenter:
    """The shipped model ``name`` as a :class:`MeshSegmenter` in eval mode on
    ``device``, its card as ``.card``. The weights must have the card's
    SHA-256 (else a ``CorruptFileError``);
    nothing is downloaded."""
    folder = Path(folder or PRETRAINED_DIR)
    card = read_card(name, folder)
    path = folder / card['weights']
    if not path.is_file():
        raise FileNotFoundError(f"'{path}', the weights of the model card "
                                f"'{folder / name}.json', is missing: reinstall "
                                f"pyg-metric-attn")
    data = path.read_bytes()
    if sha256(data) != card['sha256']:
        raise CorruptFileError(f"'{path}' is not the file its card describes "
                               f"(SHA-256 {sha256(data)[:16]}..., the card's "
                               f"{card['sha256'][:16]}...): reinstall "
                               f"pyg-metric-attn")
    state = torch.load(io.BytesIO(data), map_location='cpu', weights_only=True)
    spec = card['model']
    model_class, config_class = MODEL_CLASSES[spec['class']]
    model = model_class(spec['in_channels'], spec['out_channels'],
                        config_class(**spec['config']))
    model.load_state_dict(state)
    settings = dict(card['preprocessing'])
    version = settings.pop('version')
    preprocessing = MeshPreprocessing(**settings)
    if preprocessing.version != version:
        raise ValueError(f"'{folder / name}.json' expects meshes preprocessed "
                         f"by version {version} of MeshPreprocessing; this one "
                         f"is version {preprocessing.version}: install the "
                         f"pyg-metric-attn that shipped the model")
    segmenter = MeshSegmenter(model, preprocessing, card['classes'],
                              card['features'], card)
    return segmenter.to(device).eval()


def write_pretrained(name: str, model: torch.nn.Module,
                     preprocessing: MeshPreprocessing, classes: Sequence[str],
                     features: str, folder: str | Path,
                     **card: Any) -> dict[str, Any]:
    """Write ``model`` (a :data:`MODEL_CLASSES` model) as the shipped model
    ``name`` in ``folder``: its weights ``NAME.pt`` and its card
    ``NAME.json`` (the architecture, ``preprocessing``, ``classes``, the input
    ``features``, the weights' SHA-256 and size, and the fields of
    ``card``), each atomically. Returns the card."""
    class_name = type(model).__name__
    if class_name not in MODEL_CLASSES:
        raise TypeError(f"A shipped model is one of {sorted(MODEL_CLASSES)}, "
                        f"got {class_name}")
    folder = Path(folder)
    buffer = io.BytesIO()
    torch.save({key: value.detach().cpu().clone()
                for key, value in model.state_dict().items()}, buffer)
    data = buffer.getvalue()
    card = {'format_version': FORMAT_VERSION, 'name': name,
            'weights': f'{name}.pt', 'sha256': sha256(data),
            'size_bytes': len(data),
            'model': {'class': class_name, 'in_channels': model.in_channels,
                      'out_channels': model.out_channels,
                      'config': dataclasses.asdict(model.config)},
            'features': features,
            'preprocessing': {**preprocessing.settings,
                              'version': preprocessing.version},
            'classes': list(classes), **card}
    atomic_write_bytes(folder / f'{name}.pt', data)
    atomic_write_json(folder / f'{name}.json', card)
    return card
