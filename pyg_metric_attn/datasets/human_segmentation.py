r"""The human-body segmentation benchmark of Maron et al. 2017 (8 parts)."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch_geometric.data import extract_tar, extract_zip

from pyg_metric_attn.datasets.mesh_dataset import MeshDataset
from pyg_metric_attn.datasets.mesh_io import read_labels, read_mesh
from pyg_metric_attn.utils.download import download_url

#: MIT animation sequences of the original training set.
MIT_POSES = ('bouncing', 'handstand', 'march1', 'squat1', 'crane', 'jumping',
             'march2', 'squat2')
#: SHREC'07 test meshes (16 and 18 are absent from the benchmark).
SHREC_IDS = tuple(i for i in range(1, 21) if i not in (16, 18))


class HumanSegmentation(MeshDataset):
    r"""Human-body part segmentation (Maron et al., SIGGRAPH 2017): meshes of
    SCAPE, FAUST, MIT animation and Adobe Fuse for training, SHREC'07 for
    testing; 8 labels (0-based here): the data sets' own part ids minus one,
    :data:`~pyg_metric_attn.datasets.synthetic_humans.BODY_PARTS` (head, hand,
    lower arm, upper arm, torso, upper leg, lower leg, foot).

    Two layouts are read, both from ``root`` itself:

    * ``variant='meshcnn'`` (default): MeshCNN's remeshed copy, 381 train / 18
      test meshes of 1500 faces: ``train/*.obj``, ``test/*.obj``,
      ``seg/NAME.eseg`` (one label 1..8 per edge in MeshCNN's edge order, see
      :func:`~pyg_metric_attn.geometry.mesh_edges`) and ``sseg/NAME.seseg``
      (soft labels, 8 per edge). Each mesh keeps ``edge_label`` and
      ``edge_label_soft`` (for MeshCNN's edge accuracies); its face labels
      ``y`` are the majority of the face's three edge labels, a three-way tie
      going to the smallest label (2 of the 598,500 faces).
    * ``variant='original'``: the ``sig17_seg_benchmark`` folder as
      DiffusionNet reads it, with per-face labels (1..8):
      ``meshes/train/{adobe,faust,scape}/*``,
      ``meshes/train/MIT_animation/meshes_POSE/meshes/*``,
      ``meshes/test/shrec/{1..20}.off`` (12 is ``12_fix_orientation.off``),
      ``segs/train/adobe/NAME.txt``, ``segs/train/faust/faust_corrected.txt``,
      ``segs/train/scape/scape_corrected.txt``,
      ``segs/train/mit/mit_POSE_corrected.txt`` (one file per collection
      where the meshes share a connectivity) and
      ``segs/test/shrec/shrec_ID_full.txt``.

    Meshes are read with their vertex and face order as stored. With the raw
    files present nothing is downloaded; otherwise :meth:`download` fetches
    the canonical archive, or says where to put the files when offline.

    Args:
        root (str): Folder holding the layout above (processed files are
            written to ``root/processed`` unless ``processed_dir`` is given).
        split (str): ``'train'`` or ``'test'``.
        variant (str): ``'meshcnn'`` or ``'original'``.
        **kwargs: see :class:`~pyg_metric_attn.datasets.mesh_dataset.MeshDataset`.
    """
    urls = {
        'meshcnn': 'https://www.dropbox.com/s/s3n05sw0zg27fz3/human_seg.tar.gz',
        'original': 'https://www.dropbox.com/sh/cnyccu3vtuhq1ii/'
                    'AADgGIN6rKbvWzv0Sh-Kr417a?dl=1',
    }

    def __init__(self, root: str, split: str = 'train', variant: str = 'meshcnn',
                 **kwargs: Any):
        if split not in ('train', 'test'):
            raise ValueError(f"'split' must be 'train' or 'test', got '{split}'")
        if variant not in self.urls:
            raise ValueError(f"'variant' must be one of {tuple(self.urls)}, got "
                             f"'{variant}'")
        self.split = split
        self.variant = variant
        super().__init__(root, **kwargs)

    @property
    def raw_dir(self) -> str:
        return self.root

    @property
    def raw_file_names(self) -> list[str]:
        if self.variant == 'meshcnn':
            return ['train', 'test', 'seg', 'sseg']
        return ['meshes', 'segs']

    @property
    def processed_file_names(self) -> list[str]:
        return [f'{self.variant}_{self.split}.pt']

    def download(self) -> None:
        url = self.urls[self.variant]
        layout = ', '.join(f'{name}/' for name in self.raw_file_names)
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            try:
                archive = download_url(url, tmp, log=self.log)
            except OSError as error:
                raise RuntimeError(
                    f"The human segmentation data ({self.variant} layout) are "
                    f"not in '{self.root}' and could not be downloaded from "
                    f"{url} ({error}). Download it on a machine with internet "
                    f"and put its {layout} into '{self.root}'.") from error
            extracted = Path(tmp) / 'extracted'
            _extract(Path(archive), extracted)
            source = _find_layout(extracted, self.raw_file_names)
            for name in self.raw_file_names:
                shutil.move(str(source / name), str(Path(self.root) / name))

    def raw_meshes(self) -> Iterator[dict[str, Any]]:
        if self.variant == 'meshcnn':
            yield from self._meshcnn_meshes()
        else:
            yield from self._original_meshes()

    def _meshcnn_meshes(self) -> Iterator[dict[str, Any]]:
        root = Path(self.root)
        paths = sorted((root / self.split).glob('*.obj'))
        if not paths:
            raise FileNotFoundError(f"No .obj meshes in '{root / self.split}'")
        for path in paths:
            pos, face = read_mesh(path)
            yield dict(pos=pos, face=face, name=path.stem,
                       edge_labels=read_labels(root / 'seg' / f'{path.stem}.eseg') - 1,
                       edge_soft_labels=read_labels(
                           root / 'sseg' / f'{path.stem}.seseg', float))

    def _original_meshes(self) -> Iterator[dict[str, Any]]:
        for mesh_path, label_path in self._original_files():
            pos, face = read_mesh(mesh_path)
            name = str(mesh_path.relative_to(Path(self.root) / 'meshes'))
            yield dict(pos=pos, face=face, name=name,
                       face_labels=read_labels(label_path) - 1)

    def _original_files(self) -> list[tuple[Path, Path]]:
        """(mesh, per-face labels) pairs in DiffusionNet's layout."""
        meshes, segs = Path(self.root) / 'meshes', Path(self.root) / 'segs'
        if self.split == 'test':
            pairs = []
            for i in SHREC_IDS:
                mesh = f'{i}.off' if i != 12 else '12_fix_orientation.off'
                pairs.append((meshes / 'test' / 'shrec' / mesh,
                              segs / 'test' / 'shrec' / f'shrec_{i}_full.txt'))
            return pairs
        train = meshes / 'train'
        groups = [(train / 'adobe', None, segs / 'train' / 'adobe'),
                  (train / 'faust', segs / 'train' / 'faust' / 'faust_corrected.txt',
                   None)]
        groups += [(train / 'MIT_animation' / f'meshes_{pose}' / 'meshes',
                    segs / 'train' / 'mit' / f'mit_{pose}_corrected.txt', None)
                   for pose in MIT_POSES]
        groups.append((train / 'scape',
                       segs / 'train' / 'scape' / 'scape_corrected.txt', None))
        pairs = []
        for folder, shared_labels, label_folder in groups:
            if not folder.is_dir():
                raise FileNotFoundError(f"Missing folder '{folder}' of the "
                                        f"original human segmentation layout")
            for mesh in sorted(folder.iterdir()):
                labels = shared_labels or label_folder / f'{mesh.stem}.txt'
                pairs.append((mesh, labels))
        return pairs


def _extract(archive: Path, folder: Path) -> None:
    """Unpack a .tar.gz or .zip, and any .zip it contains."""
    if archive.name.endswith(('.tar.gz', '.tgz')):
        extract_tar(str(archive), str(folder), log=False)
    else:
        extract_zip(str(archive), str(folder), log=False)
    for inner in list(folder.rglob('*.zip')):
        extract_zip(str(inner), str(inner.parent), log=False)


def _find_layout(folder: Path, names: list[str]) -> Path:
    """The folder below ``folder`` that holds all of ``names``."""
    for candidate in [folder, *sorted(p for p in folder.rglob('*') if p.is_dir())]:
        if all((candidate / name).exists() for name in names):
            return candidate
    raise RuntimeError(f"The downloaded archive has no folder with {names}")
