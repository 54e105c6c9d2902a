r"""A trained per-vertex mesh model with the preprocessing it expects: from a
mesh file to a part label per face."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from pyg_metric_attn.geometry.mesh import MeshError, check_surface
from pyg_metric_attn.nn.models.mesh_forward import mesh_forward
from pyg_metric_attn.training.segmentation import face_logits
from pyg_metric_attn.transforms.mesh_preprocessing import MeshPreprocessing


class MeshSegmenter(torch.nn.Module):
    r"""Segments triangle meshes into parts with a trained per-vertex model:
    each face takes the class of the mean of its three vertices' logits.

    A mesh goes through :meth:`prepare` (checked to be one connected,
    edge-manifold surface of proper triangles, then the model's
    :class:`~pyg_metric_attn.transforms.MeshPreprocessing`: positions
    centred and scaled to unit radius, the operators it reads), then
    :meth:`forward` (per-vertex logits). So a mesh at any resolution, scale,
    orientation or vertex numbering is read as the training meshes were.

    Args:
        model (torch.nn.Module): A mesh model naming its ``mesh_inputs``
            (:func:`~pyg_metric_attn.nn.models.mesh_forward`), e.g. a
            :class:`~pyg_metric_attn.nn.models.MetricMeshFormer`.
        preprocessing (MeshPreprocessing): The preprocessing of its
            training meshes.
        classes (sequence of str): The name of every class.
        features (str): The model's input per vertex, the heat kernel
            signatures (``'hks'``) or the positions (``'xyz'``).
            (default: :obj:`'hks'`)
        card (dict, optional): What is known about the model (a model card,
            see :func:`~pyg_metric_attn.pretrained.human_seg`).
    """
    def __init__(self, model: torch.nn.Module, preprocessing: MeshPreprocessing,
                 classes: Sequence[str], features: Literal['hks', 'xyz'] = 'hks',
                 card: dict[str, Any] | None = None):
        super().__init__()
        if features not in ('hks', 'xyz'):
            raise ValueError(f"'features' must be 'hks' or 'xyz', got "
                             f"{features!r}")
        self.model = model
        self.preprocessing = preprocessing
        self.classes = tuple(classes)
        self.features = features
        self.card = dict(card or {})

    def reset_parameters(self):
        r"""Resets the wrapped model's parameters (an untrained segmenter
        of the same shape)."""
        self.model.reset_parameters()

    @property
    def description(self) -> str:
        """One line on the model: its card's name, model and test
        accuracy where the card gives them."""
        card = self.card
        name = type(self.model).__name__
        if not card:
            return f'{name} ({len(self.classes)} classes)'
        accuracy = card.get('metrics', {}).get('test_face_acc')
        reading = (f', test face accuracy {100 * accuracy:.2f}%'
                   if accuracy is not None else '')
        return f"shipped model {card.get('name')}: {name}{reading}"

    def prepare(self, pos: np.ndarray, face: np.ndarray,
                name: str = 'mesh') -> Data:
        """The mesh ``(pos [V, 3], face [F, 3])`` checked
        (:func:`~pyg_metric_attn.geometry.check_surface`: a
        :class:`~pyg_metric_attn.geometry.MeshError` naming the problem) and
        preprocessed as the model's training meshes were."""
        from pyg_metric_attn.datasets.mesh_dataset import mesh_data

        check_surface(pos, face, name)
        return self.preprocessing(mesh_data(pos, face, name))

    def forward(self, data: Data) -> Tensor:
        """Per-vertex logits ``[V, classes]`` of a prepared mesh (or a batch
        of them)."""
        x = data.hks if self.features == 'hks' else data.pos
        return mesh_forward(self.model, x, data)

    @torch.no_grad()
    def predict(self, data: Data) -> Tensor:
        """Face labels ``[F]`` of a prepared mesh (eval mode, on the model's
        device; returned on the CPU)."""
        device = next(self.model.parameters()).device
        training = self.training
        self.eval()
        try:
            data = data.to(device)
            return face_logits(self(data), data.face).argmax(-1).cpu()
        finally:
            self.train(training)

    def segment(self, pos: np.ndarray, face: np.ndarray,
                name: str = 'mesh') -> Tensor:
        """Face labels ``[F]`` of the mesh ``(pos [V, 3], face [F, 3])``, in
        the order of ``face``."""
        return self.predict(self.prepare(pos, face, name))

    def predict_files(self, paths: Sequence[Path], out_dir: Path
                      ) -> Iterator[tuple[Path, str | Exception]]:
        """Segment mesh files (.obj, .off, .ply, .stl): per mesh
        ``OUT/NAME.ply`` (faces coloured by part), ``NAME.png`` (a
        rendering) and ``NAME.txt`` (a label per face), NAME the file's stem
        (see :func:`output_names`); a file that is no usable mesh yields its
        :class:`~pyg_metric_attn.geometry.MeshError` (the others go on)."""
        from pyg_metric_attn.datasets.mesh_io import read_mesh, write_segmented_ply
        from pyg_metric_attn.utils.io import atomic_write_text
        from pyg_metric_attn.visualization import label_colors, render_segmentations

        for path, name in zip(paths, output_names(paths), strict=True):
            path = Path(path)
            try:
                pos, face = read_mesh(path)
                mesh = self.prepare(pos, face, path.name)
            except MeshError as error:
                yield path, error
                continue
            labels = self.predict(mesh).numpy()
            colors = label_colors(labels, len(self.classes))
            write_segmented_ply(out_dir / f'{name}.ply', pos, face, colors)
            atomic_write_text(out_dir / f'{name}.txt',
                              ''.join(f'{label}\n' for label in labels))
            render_segmentations(out_dir / f'{name}.png', mesh.pos.numpy(), face,
                                 [labels], [f'{path.name}: prediction'],
                                 self.classes)
            yield path, f'{out_dir}/{name}.{{ply,png,txt}}'


def output_names(paths: Sequence[Path]) -> list[str]:
    """Distinct output names of mesh files: the file's stem, with its
    extension where stems repeat (``a.obj``, ``a.stl`` -> ``a-obj``,
    ``a-stl``), then numbered where names still repeat."""
    paths = [Path(path) for path in paths]
    stems = Counter(path.stem for path in paths)
    names: list[str] = []
    for path in paths:
        name = (path.stem if stems[path.stem] == 1
                else f'{path.stem}-{path.suffix[1:].lower()}')
        candidate, number = name, 1
        while candidate in names:
            number += 1
            candidate = f'{name}-{number}'
        names.append(candidate)
    return names
