r"""Per-face mesh segmentation: the fixed vertex-to-face averaging and the
benchmark's metrics."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Batch


def face_logits(vertex_logits: Tensor, face: Tensor) -> Tensor:
    r"""Each face's logits are the mean of its three vertices' logits (the
    paper's fixed linear aggregation layer), ``[V, C], [3, F] -> [F, C]``."""
    return vertex_logits[face].mean(dim=0)


def edge_logits(vertex_logits: Tensor, edge_index: Tensor) -> Tensor:
    """Each edge's logits are the mean of its two endpoints' logits."""
    return vertex_logits[edge_index].mean(dim=0)


class SegmentationMeter:
    r"""Accumulates the human segmentation metrics over batches of meshes.

    * ``face_acc``: hard face accuracy (correct faces / faces);
    * ``edge_acc``: hard edge accuracy against ``edge_label`` (edges predicted
      from their endpoints, :func:`edge_logits`);
    * ``soft_edge_acc``: MeshCNN's soft accuracy: an edge counts as correct
      where its predicted class has a positive soft label, weighted by
      ``edge_label_weight`` (edge areas summing to one per mesh), averaged
      over meshes;
    * ``class_acc``: per-class face accuracy (recall), ``confusion``: face
      counts, rows true class, columns predicted.
    Edge metrics are reported only where the meshes have edge labels.
    """
    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)
        self.loss_sum: float | None = None  # None: no losses given
        self.edges = self.edges_correct = 0
        self.soft_sum = 0.0
        self.meshes = 0
        self.has_edges = self.has_soft = False

    def update(self, vertex_logits: Tensor, batch: Batch,
               loss: Tensor | None = None) -> None:
        faces = face_logits(vertex_logits, batch.face)
        predicted = faces.argmax(dim=-1)
        index = batch.y * self.num_classes + predicted
        self.confusion += torch.bincount(  # kept on the CPU
            index, minlength=self.num_classes ** 2).view_as(self.confusion).cpu()
        if loss is not None:
            self.loss_sum = ((self.loss_sum or 0.0)
                             + float(loss) * batch.y.numel())
        self.meshes += batch.num_graphs
        if getattr(batch, 'edge_label', None) is None:
            return
        edge_predicted = edge_logits(vertex_logits,
                                     batch.edge_label_index).argmax(dim=-1)
        self.has_edges = True
        self.edges += batch.edge_label.numel()
        self.edges_correct += int((edge_predicted == batch.edge_label).sum())
        soft = getattr(batch, 'edge_label_soft', None)
        if soft is not None:
            self.has_soft = True
            hit = soft.gather(1, edge_predicted.unsqueeze(1)).squeeze(1)
            self.soft_sum += float((hit.float() * batch.edge_label_weight).sum())

    def merge(self, other: SegmentationMeter) -> None:
        """Add the counts of ``other`` (e.g. another rank's share of the
        meshes), as if its batches had been given to :meth:`update`."""
        if other.num_classes != self.num_classes:
            raise ValueError(f"Cannot merge a meter of {other.num_classes} "
                             f"classes into one of {self.num_classes}")
        self.confusion += other.confusion
        if other.loss_sum is not None:
            self.loss_sum = (self.loss_sum or 0.0) + other.loss_sum
        self.edges += other.edges
        self.edges_correct += other.edges_correct
        self.soft_sum += other.soft_sum
        self.meshes += other.meshes
        self.has_edges |= other.has_edges
        self.has_soft |= other.has_soft

    def compute(self, prefix: str = '') -> dict[str, float]:
        """Scalar metrics (``loss`` where losses were given)."""
        faces = int(self.confusion.sum())
        out = {'face_acc': float(self.confusion.diagonal().sum()) / max(faces, 1)}
        if self.loss_sum is not None:
            out['loss'] = self.loss_sum / max(faces, 1)
        if self.has_edges:
            out['edge_acc'] = self.edges_correct / max(self.edges, 1)
        if self.has_soft:
            out['soft_edge_acc'] = self.soft_sum / max(self.meshes, 1)
        return {prefix + key: value for key, value in out.items()}

    def details(self) -> dict[str, Any]:
        """Per-class accuracy (NaN for classes absent from the labels) and the
        confusion matrix, as lists."""
        support = self.confusion.sum(dim=1)
        recall = self.confusion.diagonal().double() / support.double()
        return {'class_acc': recall.tolist(),
                'confusion': self.confusion.tolist()}
