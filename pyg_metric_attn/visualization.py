"""Segmented meshes as pictures (matplotlib, no OpenGL) and colours.

Figures written to files are drawn by matplotlib's Agg canvas directly
(:func:`file_figure`), without pyplot: they need no display, and the
backend the user chose for pyplot stays as it is.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('experiments'):
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection


def file_figure(**kwargs: Any) -> Figure:
    """A :class:`~matplotlib.figure.Figure` (``kwargs``: its arguments) on an
    Agg canvas of its own, for writing an image file."""
    figure = Figure(**kwargs)
    FigureCanvasAgg(figure)
    return figure


#: The colour of marked faces (:func:`label_colors`): black, in no palette.
MARK_COLOR = (0, 0, 0, 255)


def label_colors(labels: np.ndarray, num_classes: int = 8,
                 marked: np.ndarray | None = None) -> np.ndarray:
    """``[N, 4]`` uint8 RGBA colours of integer labels (tab10 palette), and
    :data:`MARK_COLOR` where the boolean ``marked`` ``[N]`` is set (e.g. the
    faces whose prediction changed)."""
    palette = matplotlib.colormaps['tab10' if num_classes <= 10 else 'tab20']
    rgba = palette(np.asarray(labels) % palette.N)
    colors = (np.asarray(rgba) * 255).round().astype(np.uint8)
    if marked is not None:
        marked = np.asarray(marked, dtype=bool)
        if marked.shape != colors.shape[:1]:
            raise ValueError(f"'marked' must hold one flag per label "
                             f"({colors.shape[0]}), got shape {marked.shape}")
        colors[marked] = MARK_COLOR
    return colors


def _draw(ax, pos: np.ndarray, face: np.ndarray, colors: np.ndarray,
          view: tuple[float, float]) -> None:
    # Here, not at the top: figures of point sets need no mesh packages.
    from pyg_metric_attn.geometry.mesh import face_normals

    light = np.array([0.3, 0.5, 1.0])
    light /= np.linalg.norm(light)
    shade = 0.45 + 0.55 * np.abs(face_normals(pos, face) @ light)
    rgb = colors[:, :3] / 255.0 * shade[:, None]
    # Matplotlib has no depth buffer: draw faces far to near (painter's order).
    elev, azim = np.deg2rad(view[0]), np.deg2rad(view[1])
    eye = np.array([np.cos(elev) * np.cos(azim), np.cos(elev) * np.sin(azim),
                    np.sin(elev)])
    order = np.argsort(pos[face].mean(1) @ eye)
    ax.add_collection3d(Poly3DCollection(pos[face[order]], facecolors=rgb[order],
                                         edgecolors='none'))
    low, high = pos.min(0), pos.max(0)
    centre, half = (low + high) / 2, (high - low).max() / 2
    for setter, c in zip((ax.set_xlim, ax.set_ylim, ax.set_zlim), centre,
                         strict=True):
        setter(c - half, c + half)
    ax.set_box_aspect((1, 1, 1), zoom=1.5)
    ax.view_init(*view)
    ax.set_axis_off()


def render_segmentations(path: str | Path, pos: np.ndarray, face: np.ndarray,
                         labelings: Sequence[np.ndarray], titles: Sequence[str],
                         class_names: Sequence[str] | None = None,
                         views: Sequence[tuple[float, float]] = ((10, -60), (10, 30)),
                         up_axis: int | None = None,
                         marked: Sequence[np.ndarray | None] | None = None) -> None:
    """A PNG with one column per labeling (e.g. ground truth, prediction) and
    one row per view; ``up_axis`` is the mesh's vertical axis (default: the
    axis of largest extent); ``marked``: per labeling, faces drawn in
    :data:`MARK_COLOR` (or :obj:`None`)."""
    pos = np.asarray(pos, dtype=np.float64)
    if up_axis is None:
        up_axis = int(np.argmax(np.ptp(pos, axis=0)))
    pos = np.roll(pos, 2 - up_axis, axis=1)
    face = np.asarray(face)
    num_classes = max(int(np.max(labels)) for labels in labelings) + 1
    if class_names is not None:
        num_classes = max(num_classes, len(class_names))
    fig = file_figure(figsize=(3.2 * len(labelings), 3.4 * len(views)))
    if marked is None:
        marked = [None] * len(labelings)
    elif len(marked) != len(labelings):
        raise ValueError(f"'marked' must hold one face mask (or None) per "
                         f"labeling ({len(labelings)}), got {len(marked)}")
    for column, (labels, title, marks) in enumerate(zip(labelings, titles, marked,
                                                        strict=True)):
        colors = label_colors(labels, num_classes, marks)
        for row, view in enumerate(views):
            ax = fig.add_subplot(len(views), len(labelings),
                                 row * len(labelings) + column + 1,
                                 projection='3d')
            _draw(ax, pos, face, colors, view)
            if row == 0:
                ax.set_title(title)
    bottom = 0.0
    if class_names is not None:
        bottom = _class_legend(fig, class_names, num_classes)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _class_legend(fig: Figure, class_names: Sequence[str],
                  num_classes: int) -> float:
    """A legend of the class colours at the bottom, in as many columns (up
    to 4) as fit the figure's width; returns the height share it takes."""
    handles = [Rectangle((0, 0), 1, 1, color=c[:3] / 255)
               for c in label_colors(np.arange(len(class_names)), num_classes)]
    renderer = fig.canvas.get_renderer()
    ncol = min(len(class_names), 4)
    while True:
        legend = fig.legend(handles, class_names, loc='lower center', ncol=ncol,
                            fontsize=8, frameon=False)
        box = legend.get_window_extent(renderer)
        if box.width <= fig.bbox.width or ncol == 1:
            return box.height / fig.bbox.height
        legend.remove()
        ncol -= 1
