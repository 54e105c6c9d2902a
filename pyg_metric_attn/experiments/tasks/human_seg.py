r"""Human-body mesh segmentation: per-face part labels from per-vertex
attention models (the paper's Figure 5 setting, extended).

Models run on the mesh's vertex graph and predict per vertex; each face takes
the mean of its three vertices' logits (the paper's fixed linear aggregation)
and the loss is the cross entropy over faces. ``attention`` names the model:
the paper's IPN with ``'metric'``, ``'l2'``, ``'dot'`` (this library's
:class:`~pyg_metric_attn.nn.MetricAttentionConv`) or PyG's ``'gat'``,
``'gatv2'``, ``'transformer'`` in the same slots, or ``'metricformer'``,
:class:`~pyg_metric_attn.nn.models.MetricMeshFormer` (local plus global
metric-attention with residual feed-forward blocks, configured by the task's
``former`` (:class:`~pyg_metric_attn.nn.models.MetricMeshFormerConfig`, set as
``former_FIELD``); its learning rate follows a cosine schedule to zero over
the epochs unless ``former_cosine=False``; every block starts with a
learned-time heat diffusion over the mesh, for which the meshes carry their
``k`` eigenpairs, unless ``former_diffusion=False``; and DiffusionNet's
spatial gradient features of the diffused channels, from tangent gradient
operators the meshes carry, unless ``former_gradients=False``), or
``'diffusionnet'``, the baseline :class:`~pyg_metric_attn.nn.models.DiffusionNet`
(configured by ``diffusionnet`` as ``diffusionnet_FIELD``; its recipe's
learning rate halves every ``step_lr_epochs`` epochs; it reads the
eigenpairs and gradient operators the former's diffusion and gradients
have the meshes carry).

Data: the MeshCNN human_seg benchmark where ``root`` is given (raw files as
:class:`~pyg_metric_attn.datasets.HumanSegmentation` reads them), else
:class:`~pyg_metric_attn.datasets.SyntheticHumans` (offline). Inputs are the
16 heat kernel signatures per vertex (``features='hks'``) or the normalised
coordinates with a uniformly random rotation of every training mesh
(``features='xyz'``; ``xyz_rotation='up'``: about the y axis, DiffusionNet's
augmentation, though the MeshCNN meshes are not all upright along one axis;
``xyz_scaling=S > 1``: and a scale factor drawn log-uniformly from
``[1/S, S]``). With ``hks_time_jitter=J > 1`` every training mesh's HKS
are recomputed each step at diffusion times stretched by a factor drawn
log-uniformly from ``[1/J, J]`` (a random size change of the mesh; needs the
eigenpairs the former's diffusion carries). ``hks_min_time=T`` computes the
HKS of every mesh at times log-spaced in ``[T, 1]`` instead of ``[0.01, 1]``
(from the same eigenpairs): longer shortest times weigh less the upper end
of the spectrum, which a coarse mesh resolves least. ``mesh_area=A`` scales
every mesh to surface area ``A`` with its operators and HKS
(:func:`~pyg_metric_attn.transforms.scale_to_area`; needs the eigenpairs),
so that its inputs do not depend on the pose or roughness behind its unit
maximum radius. ``mesh_smoothing=S`` computes every mesh's operators (HKS,
eigenpairs, gradients) after ``S`` rounds of Taubin smoothing
(:func:`~pyg_metric_attn.geometry.taubin_smoothing`), which damps vertex
noise (the rounds act over edges: a coarser mesh is smoothed over a wider
patch); a model that reads only ``xyz`` and no operators does not see it. With
``augment_copies=N > 0`` every training mesh gets ``N`` perturbed copies per
perturbation of ``augment_perturbations``
(:func:`~pyg_metric_attn.geometry.perturb_mesh`: remeshed, deformed, ...;
one of a perturbation that draws nothing, as loop subdivision, whose further
copies would be the same mesh; processed once and cached as
:class:`~pyg_metric_attn.datasets.PerturbedMeshes` under the processed
files' ``augmentation/``), and every epoch each training mesh is itself or
one of its copies, drawn uniformly (:class:`~pyg_metric_attn.datasets.RandomCopies`):
geometric augmentation for any inputs. ``label_smoothing > 0`` smooths the
training targets and ``corner_loss > 0`` adds a cross entropy at every face's
corner points (:meth:`HumanSegTask.training_loss`; evaluation losses stay
plain cross entropy over the faces). With ``val_fraction > 0`` a seeded share
of the training meshes is held out and evaluated instead of the test set (for
tuning without the test set); with ``val_source=PREFIX`` the training meshes
whose names start with ``PREFIX`` are (e.g. ``adobe``: a whole source of the
benchmark, so that validation sees people the training did not, as the test
set does). Otherwise the test set is evaluated after every epoch and the last
epoch is reported (no model selection on the test set).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch_geometric.loader import DataLoader

from pyg_metric_attn.datasets import (
    BODY_PARTS,
    HumanSegmentation,
    PerturbedMeshes,
    RandomCopies,
    SyntheticHumans,
)
from pyg_metric_attn.datasets.mesh_dataset import mesh_data
from pyg_metric_attn.datasets.mesh_io import read_mesh, write_segmented_ply
from pyg_metric_attn.experiments.attention import (
    ATTENTIONS,
    attention_factory,
    metric_options,
)
from pyg_metric_attn.experiments.config import TaskConfig, setting
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.geometry import HKS_MIN_TIME, PERTURBATIONS, MeshError
from pyg_metric_attn.geometry.perturbations import distinct_copy_seeds
from pyg_metric_attn.nn.models import (
    IPN,
    DiffusionNet,
    DiffusionNetConfig,
    MetricMeshFormer,
    MetricMeshFormerConfig,
)
from pyg_metric_attn.training import (
    DistributedContext,
    Trainer,
    epoch_generator,
    eval_mode,
    seed_everything,
    shard_indices,
    strided_share,
    unwrap,
)
from pyg_metric_attn.training.segmentation import (
    SegmentationMeter,
    corner_logits,
    face_logits,
)
from pyg_metric_attn.training.weight_decay import weight_decay_groups
from pyg_metric_attn.transforms import (
    MeshPreprocessing,
    random_rotation,
    rescaled_heat_kernel_signatures,
    scale_to_area,
)
from pyg_metric_attn.utils.data_home import data_home
from pyg_metric_attn.utils.io import atomic_write_text
from pyg_metric_attn.visualization import label_colors, render_segmentations

STRONG_MODEL = 'metricformer'
BASELINE_MODEL = 'diffusionnet'
MODELS = (*ATTENTIONS, STRONG_MODEL, BASELINE_MODEL)


def default_former() -> MetricMeshFormerConfig:
    """The former of the human_seg runs in RESULTS.md (64 wide, 4 blocks of 4
    heads, dropout 0.1, global attention to every 8th vertex, heat diffusion
    and gradient features)."""
    return MetricMeshFormerConfig(hidden_channels=64, num_layers=4, heads=4,
                                  dropout=0.1, global_stride=8, diffusion=True,
                                  gradients=True)


@dataclass(frozen=True)
class HumanSegConfig(TaskConfig):
    """The human_seg task's settings."""
    # The paper's IPN (Table 2): d_Q = d_mlp = 64, Adam lr 1e-3, wd 1e-4.
    hidden: int = setting(64, ge=1)
    mlp_channels: int = setting(64, ge=1)
    num_layers: int = setting(2, ge=1)
    heads: int = setting(1, ge=1)
    lr: float = setting(1e-3, gt=0)
    weight_decay: float = setting(1e-4, ge=0)
    #: Weight decay of the pseudo-metric maps' tanh MLPs (None: 'weight_decay';
    #: see :mod:`pyg_metric_attn.training.weight_decay`).
    metric_mlp_weight_decay: float | None = setting(None, ge=0)
    batch_size: int = setting(8, ge=1)
    #: Heat-kernel time t of metric/l2/dot: a number, 'matched' or
    #: {attention: t}.
    time_scale: float | Literal['matched'] | dict[str, float] = setting(1.0, gt=0)
    learn_time_scale: bool = False
    #: metric/l2/dot only: a value map W_v (H' = S H W_v) and a linear map of
    #: the vertex's own features added (TransformerConv's root weight).
    value: bool = False
    residual: bool = False
    #: IPN's normalisation of the similarities (metric/l2/dot; 'global'
    #: needs each mesh's vertices told apart, which the IPN does not pass;
    #: the former's is former_normalization).
    normalization: Literal['row', 'column', 'sinkhorn'] = 'row'
    sinkhorn_iterations: int = setting(3, ge=1)
    features: Literal['hks', 'xyz'] = 'hks'
    #: features='xyz', training: a random rotation of SO(3), about the y
    #: axis ('up') or none, and a scale factor log-uniform in [1/S, S].
    xyz_rotation: Literal['so3', 'up', 'none'] = 'so3'
    xyz_scaling: float = setting(1.0, ge=1)
    #: Geometric augmentation: perturbed copies of the training meshes.
    augment_copies: int = setting(0, ge=0)
    augment_perturbations: str = 'decimation,anisotropic_scaling,jitter'
    hks_time_jitter: float = setting(1.0, ge=1)
    hks_min_time: float = setting(HKS_MIN_TIME, gt=0, lt=1)
    #: Every mesh scaled to this surface area with its operators after the
    #: unit maximum radius (scale_to_area); None: that radius alone.
    mesh_area: float | None = setting(None, gt=0)
    #: Taubin smoothing rounds of every mesh before its operators
    #: (MeshPreprocessing's smoothing).
    mesh_smoothing: int = setting(0, ge=0)
    label_smoothing: float = setting(0.0, ge=0, lt=1)
    #: Weight of a second cross entropy, at every face's three corner points
    #: (corner_logits: where one Loop subdivision step puts the centroids of
    #: its corner faces), added to the faces' own.
    corner_loss: float = setting(0.0, ge=0)
    val_fraction: float = setting(0.0, ge=0, lt=1)
    val_source: str | None = None
    data_seed: int = 0
    #: MetricMeshFormer ('metricformer'): its architecture, and a cosine
    #: learning-rate schedule.
    former: MetricMeshFormerConfig = setting(default_factory=default_former)
    former_cosine: bool = True
    #: DiffusionNet ('diffusionnet'): its architecture (default: the paper's
    #: 4 blocks x 128, dropout 0.5), and its learning rate halved every
    #: step_lr_epochs epochs.
    diffusionnet: DiffusionNetConfig = setting(default_factory=DiffusionNetConfig)
    step_lr_epochs: int = setting(50, ge=1)
    # Data.
    root: str | None = None
    processed_dir: str | None = None
    #: Folder of the synthetic humanoids (without ``root``); default:
    #: ``processed_dir``, else :func:`~pyg_metric_attn.utils.data_home.data_home`
    #: ``/synthetic_humans``.
    synthetic_root: str | None = None
    synthetic_train: int = setting(120, ge=1)
    synthetic_test: int = setting(30, ge=1)
    #: Eigenpairs per mesh and heat kernel signatures per vertex.
    k: int = setting(128, ge=1)
    hks_count: int = setting(16, ge=1)
    num_workers: int = setting(2, ge=1, record=False)
    #: Folder for each run's checkpoints, a coloured .ply and a rendering.
    artifacts: str | None = setting(None, record=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.val_fraction > 0 and self.val_source:
            raise ValueError("Set 'val_fraction' or 'val_source', not both")
        for name, default in (('hks_time_jitter', 1.0),
                              ('hks_min_time', HKS_MIN_TIME)):
            if getattr(self, name) != default and not (
                    self.features == 'hks' and self.former.diffusion):
                raise ValueError(f"'{name}' recomputes HKS from the meshes' "
                                 f"eigenpairs: it needs features='hks' and "
                                 f"former_diffusion=True")
        if self.mesh_area is not None and not self.former.diffusion:
            raise ValueError("'mesh_area' recomputes the HKS of the scaled "
                             "meshes from their eigenpairs: it needs "
                             "former_diffusion=True")
        if self.features != 'xyz' and (self.xyz_rotation != 'so3'
                                       or self.xyz_scaling != 1):
            raise ValueError("'xyz_rotation' and 'xyz_scaling' augment the "
                             "coordinates: they need features='xyz'")
        unknown = set(self.augmentations) - set(PERTURBATIONS)
        if unknown or not self.augmentations:
            raise ValueError(f"'augment_perturbations' must name some of "
                             f"{', '.join(PERTURBATIONS)} (comma-separated), "
                             f"got {self.augment_perturbations!r}")

    @property
    def augmentations(self) -> list[str]:
        """The perturbations of ``augment_perturbations``."""
        return [name for name in self.augment_perturbations.split(',') if name]


class HumanSegTask(Task):
    """Human mesh segmentation (MeshCNN human_seg, or synthetic humanoids)."""
    name = 'human_seg'
    default_attentions = ('metric', 'l2', 'dot', 'gat', 'gatv2', 'transformer')
    final_metric = 'test_face_acc'
    curve_metrics = ('train_loss', 'test_face_acc')
    default_epochs = 100
    config_class = HumanSegConfig
    config: HumanSegConfig

    def __init__(self, config: HumanSegConfig | None = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        c = self.config
        self.eval_split = 'val' if c.val_fraction > 0 or c.val_source else 'test'
        self.final_metric = f'{self.eval_split}_face_acc'
        self.curve_metrics = ('train_loss', self.final_metric)
        #: Every mesh's preprocessing: the data sets' pre_transform and
        #: prepare_mesh's. No operator cache: the processed files hold them.
        #: The farthest-point ranks spare the former's global step a
        #: sampling loop in every forward pass.
        self.preprocessing = MeshPreprocessing(
            c.k, c.hks_count, self.spectral_basis, self.gradients,
            smoothing=c.mesh_smoothing,
            farthest_point_ranks=(c.former.global_attention
                                  and c.former.global_stride > 1))
        self._data = None

    @classmethod
    def add_arguments(cls, parser: Any, command: str = 'experiment') -> None:
        parser.add_argument('--root', help='MeshCNN human_seg folder (train/, '
                            'test/, seg/, sseg/); default: synthetic humanoids')
        parser.add_argument('--processed-dir', help='where processed files go '
                            '(default: ROOT/processed; without --root, the '
                            'synthetic humanoids: $PYG_METRIC_ATTN_DATA/'
                            'synthetic_humans, default ~/.cache/pyg-metric-attn)')
        if command in ('experiment', 'train'):
            parser.add_argument('--features', choices=('hks', 'xyz'),
                                help='inputs per vertex (default: hks)')
        if command == 'experiment':
            parser.add_argument('--artifacts', help='folder for each run\'s '
                                'checkpoints, a coloured .ply and a rendering')

    # Data ------------------------------------------------------------------
    def datasets(self) -> tuple[Any, Any]:
        """``(train meshes, evaluation meshes)`` (evaluation: test or val)."""
        if self._data is None:
            c = self.config
            if not c.root:
                print(f'synthetic humanoids in {self.synthetic_root}')
            train, test = self.split_meshes('train'), self.split_meshes('test')
            if c.val_source:
                train, test = _split_by_source(train, c.val_source)
            elif self.eval_split == 'val':
                generator = torch.Generator().manual_seed(c.data_seed)
                order = torch.randperm(len(train), generator=generator)
                num_val = max(1, round(c.val_fraction * len(train)))
                train, test = train[order[num_val:]], train[order[:num_val]]
            self._data = train, test
        return self._data

    def split_meshes(self, split: str) -> Any:
        """The processed meshes of the data's ``'train'`` or ``'test'``
        split (all of them: no validation meshes held out)."""
        c = self.config
        common = dict(pre_transform=self.preprocessing,
                      num_workers=c.num_workers, log=self.progress)
        if c.root:
            return HumanSegmentation(c.root, split,
                                     processed_dir=c.processed_dir, **common)
        count = c.synthetic_train if split == 'train' else c.synthetic_test
        return SyntheticHumans(str(self.synthetic_root), split, count, **common)

    def prepare_data(self) -> None:
        self.augmented(self.datasets()[0])

    @property
    def synthetic_root(self) -> Path:
        """Folder of the synthetic humanoids: ``synthetic_root``, else
        ``processed_dir``, else ``DATA_HOME/synthetic_humans`` (``DATA_HOME``:
        ``$PYG_METRIC_ATTN_DATA``, default ``~/.cache/pyg-metric-attn``)."""
        c = self.config
        return Path(c.synthetic_root or c.processed_dir
                    or data_home() / 'synthetic_humans')

    @property
    def spectral_basis(self) -> int:
        """Eigenpairs each mesh carries: all ``k`` for the former's heat
        diffusion, else none."""
        return self.config.k if self.config.former.diffusion else 0

    @property
    def gradients(self) -> bool:
        """Whether the meshes carry tangent gradient operators (for the
        former's gradient features)."""
        return self.config.former.diffusion and self.config.former.gradients

    def scaled(self, batch):
        """The meshes scaled to ``mesh_area`` with their operators (as they
        are without it)."""
        if self.config.mesh_area is None:
            return batch
        # No checks on this hot path: the config's former_diffusion has every
        # mesh prepared with all k eigenpairs of its HKS (spectral_basis).
        return scale_to_area(batch, self.config.mesh_area, verify=False)

    def inputs(self, batch, augment: bool = False) -> torch.Tensor:
        """The model input per vertex; when augmenting, coordinates are
        rotated and scaled (``xyz_rotation``, ``xyz_scaling``) and HKS
        rescaled in time (``hks_time_jitter``); HKS at other times than the
        stored ones (``hks_min_time``) are computed from the eigenpairs."""
        if self.config.features == 'hks':
            jitter = self.config.hks_time_jitter
            min_time = self.config.hks_min_time
            if (not augment or jitter == 1) and min_time == HKS_MIN_TIME:
                return batch.hks
            log_scale = torch.zeros(batch.evals.size(0), device=batch.hks.device)
            if augment:
                log_scale = (2 * torch.rand_like(log_scale) - 1) * math.log(jitter)
            return rescaled_heat_kernel_signatures(
                batch.evals, batch.evecs, batch.batch,  # None: one mesh
                log_scale.exp().to(batch.evals.dtype), batch.hks.size(1),
                min_time)
        c = self.config
        if not augment:
            return batch.pos
        maps = torch.eye(3, dtype=torch.float64).repeat(batch.num_graphs, 1, 1)
        if c.xyz_rotation != 'none':
            axis = 1 if c.xyz_rotation == 'up' else None
            maps = torch.stack([random_rotation(axis=axis)
                                for _ in range(batch.num_graphs)])
        if c.xyz_scaling > 1:
            log_scale = (2 * torch.rand(batch.num_graphs) - 1) * math.log(
                c.xyz_scaling)
            maps = maps * log_scale.exp().double()[:, None, None]
        return torch.einsum('vij,vj->vi', maps.to(batch.pos)[batch.batch],
                            batch.pos)

    def augmented(self, train) -> Any:
        """The training meshes, each drawn from itself and its perturbed
        copies with ``augment_copies > 0`` (else as they are)."""
        c = self.config
        if not c.augment_copies:
            return train
        root = Path(train.processed_root) / 'augmentation'
        copies = [PerturbedMeshes(root, train, perturbation, seed,
                                  pre_transform=self.preprocessing,
                                  num_workers=c.num_workers, log=self.progress)
                  for perturbation in c.augmentations
                  for seed in distinct_copy_seeds(perturbation, 0,
                                                  c.augment_copies)]
        return RandomCopies(train, copies)

    # Model -----------------------------------------------------------------
    def build_model(self, attention: str) -> torch.nn.Module:
        c = self.config
        in_channels = c.hks_count if c.features == 'hks' else 3
        if attention == STRONG_MODEL:
            return MetricMeshFormer(in_channels, len(BODY_PARTS),
                                    replace(c.former, gradients=self.gradients))
        if attention == BASELINE_MODEL:
            if not self.spectral_basis or (c.diffusionnet.gradient_features
                                           and not self.gradients):
                raise ValueError("'diffusionnet' reads the meshes' eigenpairs "
                                 "and gradient operators, which they carry "
                                 "with former_diffusion=True and "
                                 "former_gradients=True")
            return DiffusionNet(in_channels, len(BODY_PARTS), c.diffusionnet)
        if attention not in ATTENTIONS:
            raise ValueError(f"Unknown model '{attention}'; expected one of "
                             f"{MODELS}")
        time_scale = c.time_scale
        if isinstance(time_scale, dict):
            time_scale = time_scale[attention]
        conv = attention_factory(
            attention, heads=c.heads, concat=False,
            **metric_options(attention, value=c.value, mlp_channels=c.mlp_channels,
                             time_scale=time_scale,
                             learn_time_scale=c.learn_time_scale,
                             residual=c.residual,
                             normalization=c.normalization,
                             sinkhorn_iterations=c.sinkhorn_iterations))
        return IPN(in_channels, c.hidden, len(BODY_PARTS), c.num_layers,
                   conv=conv)

    def forward(self, model: torch.nn.Module, batch, augment: bool = False):
        """Per-vertex logits of a batch of meshes."""
        batch = self.scaled(batch)
        x = self.inputs(batch, augment)
        if isinstance(unwrap(model), DiffusionNet):
            gradients = ((batch.grad_index, batch.grad_weight)
                         if self.gradients else (None, None))
            return model(x, batch.evecs, batch.evals, batch.mass, *gradients,
                         batch=batch.batch)
        if isinstance(unwrap(model), MetricMeshFormer):
            keys = (('evecs', 'evals', 'mass') if self.spectral_basis else ())
            keys += ('grad_index', 'grad_weight') if self.gradients else ()
            keys += (('farthest_point_rank',)
                     if 'farthest_point_rank' in batch else ())
            return model(x, batch.edge_index, batch.batch, pos=batch.pos,
                         **{key: batch[key] for key in keys})
        return model(x, batch.edge_index)

    def evaluate(self, model: torch.nn.Module, meshes,
                 batch_size: int | None = None,
                 distributed: DistributedContext | None = None
                 ) -> SegmentationMeter:
        """Metrics of ``model`` on ``meshes`` (eval mode, no gradients); with
        several processes each evaluates its share and every rank gets the
        metrics of all meshes."""
        context = distributed or DistributedContext()
        if context.is_distributed:
            meshes = [meshes[i] for i in strided_share(len(meshes), context)]
        meter = SegmentationMeter(len(BODY_PARTS))
        loader = DataLoader(meshes, batch_size or self.config.batch_size,
                            pin_memory=self.placement.pin_memory)
        model = self.placement.move(model)
        with eval_mode(model), self.placement.autocast():
            for batch in loader:
                batch = self.placement.move(batch)
                logits = self.forward(model, batch)
                loss = F.cross_entropy(face_logits(logits, batch.face), batch.y)
                meter.update(logits, batch, loss)
        if context.is_distributed:
            shares = context.gather_objects(meter)
            meter = SegmentationMeter(len(BODY_PARTS))
            for share in shares:
                meter.merge(share)
        return meter

    def evaluate_split(self, model: torch.nn.Module,
                       split: str) -> tuple[dict[str, Any], str]:
        """Face, edge and soft edge accuracy, per-class accuracy and the
        confusion matrix on ``'test'`` (the evaluation meshes: the
        validation ones with ``val_fraction``/``val_source``) or
        ``'train'``."""
        train, evaluation = self.datasets()
        meter = self.evaluate(model, train if split == 'train' else evaluation)
        result = {**meter.compute(), **meter.details()}
        width = max(len(name) for name in BODY_PARTS)
        lines = [f'{key}: {100 * result[key]:.2f}%' for key in
                 ('face_acc', 'edge_acc', 'soft_edge_acc') if key in result]
        lines += [f'  {name:<{width}} {100 * acc:6.2f}%' for name, acc in
                  zip(BODY_PARTS, result['class_acc'], strict=True)]
        lines.append('confusion (rows: true, columns: predicted):')
        lines += ['  ' + ' '.join(f'{count:6d}' for count in row)
                  for row in result['confusion']]
        return result, '\n'.join(lines)

    # Training --------------------------------------------------------------
    def training_loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        r"""Cross entropy over the faces of augmented inputs; with
        ``label_smoothing`` :math:`\varepsilon` each face's target puts
        :math:`1 - \varepsilon` on its label and spreads :math:`\varepsilon`
        evenly over all classes. With ``corner_loss`` :math:`\lambda > 0`
        plus :math:`\lambda` times the cross entropy over the faces' corner
        points (:func:`~pyg_metric_attn.training.segmentation.corner_logits`,
        each with its face's label), so that a face's label holds across
        the face and not at its centroid alone: the corner points are what
        the corner faces of a Loop-subdivided copy read out from a model
        that subdivision does not change."""
        return self.label_loss(self.forward(model, batch, augment=True), batch)

    def label_loss(self, vertex_logits: torch.Tensor, batch) -> torch.Tensor:
        """The loss of :meth:`training_loss` on ``batch``'s face labels, of
        its vertex logits ``[N, classes]``."""
        c = self.config
        loss = F.cross_entropy(face_logits(vertex_logits, batch.face), batch.y,
                               label_smoothing=c.label_smoothing)
        if c.corner_loss:
            corners = corner_logits(vertex_logits, batch.face)
            loss = loss + c.corner_loss * F.cross_entropy(
                corners.flatten(0, 1), batch.y.repeat(3),
                label_smoothing=c.label_smoothing)
        return loss

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Adam:
        """Adam with the config's learning rate and weight decay (the
        pseudo-metric MLPs' own with ``metric_mlp_weight_decay``)."""
        c = self.config
        return torch.optim.Adam(
            weight_decay_groups(model, c.weight_decay, c.metric_mlp_weight_decay),
            lr=c.lr)

    def fit(self, attention: str, seed: int, out_dir: str | Path | None = None,
            resume: bool = False,
            before_training: Callable[[], None] | None = None,
            distributed: DistributedContext | None = None
            ) -> tuple[torch.nn.Module, Trainer]:
        """With several processes (``distributed``) each rank trains on its
        share of the meshes (``batch_size`` per rank), draws its own
        augmentations, and evaluates its share of the evaluation meshes."""
        c = self.config
        context = distributed or DistributedContext()
        train, evaluation = self.datasets()
        train = self.augmented(train)
        seed_everything(seed)
        model = self.placement.move(self.build_model(attention))
        if context.is_distributed:
            seed_everything(context.rank_seed(seed))
        optimizer = self.build_optimizer(model)
        scheduler = None
        if attention == STRONG_MODEL and c.former_cosine:
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer,
                                                                   self.epochs)
        elif attention == BASELINE_MODEL:
            scheduler = torch.optim.lr_scheduler.StepLR(
                optimizer, c.step_lr_epochs, gamma=0.5)

        def batches(epoch: int):
            if context.is_distributed:
                share = shard_indices(len(train), context, seed, epoch)
                return DataLoader(train, c.batch_size, sampler=share.tolist(),
                                  pin_memory=self.placement.pin_memory)
            return DataLoader(train, c.batch_size, shuffle=True,
                              generator=epoch_generator(seed, epoch),
                              pin_memory=self.placement.pin_memory)

        def evaluate(model: torch.nn.Module) -> dict[str, float]:
            return self.evaluate(model, evaluation, distributed=context
                                 ).compute(f'{self.eval_split}_')

        trainer = Trainer(model, optimizer, self.training_loss, evaluate,
                          scheduler=scheduler, out_dir=out_dir,
                          progress=self.progress,
                          desc=f'human_seg {attention} seed {seed}',
                          distributed=context, placement=self.placement)
        trainer.fit(batches, self.epochs, resume, before_training)
        return model, trainer

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        artifacts = self.config.artifacts
        out_dir = (Path(artifacts) / f'{attention}-seed{seed}'
                   if artifacts else None)
        model, trainer = self.fit(attention, seed, out_dir)
        history = trainer.history
        final = {k: v for k, v in history[-1].items()
                 if k.startswith(f'{self.eval_split}_')}
        final.update(self.evaluate(model, self.datasets()[1]).details())
        final['parameters'] = sum(p.numel() for p in model.parameters())
        if out_dir is not None:
            self.save_example(model, out_dir)
        return {'history': history, 'final': final}

    def vertex_scores(self, model: torch.nn.Module, mesh) -> torch.Tensor:
        """Vertex logits ``[N, classes]`` of one processed mesh (on the
        CPU)."""
        model, moved = self.placement.move(model), self.placement.move(mesh)
        with eval_mode(model), self.placement.autocast():
            return self.forward(model, moved).cpu()

    def face_scores(self, model: torch.nn.Module, mesh) -> torch.Tensor:
        """Face logits ``[F, classes]`` of one processed mesh (on the CPU),
        each face's the mean of its vertices' (what the loss reads)."""
        return face_logits(self.vertex_scores(model, mesh), mesh.face.cpu())

    def predict(self, model: torch.nn.Module, mesh) -> torch.Tensor:
        """Predicted face labels of one processed mesh (on the CPU)."""
        return self.face_scores(model, mesh).argmax(-1)

    def prepare_mesh(self, pos, face, name: str):
        """A mesh as read from its file, processed as the training meshes
        were (:attr:`preprocessing`)."""
        return self.preprocessing(mesh_data(pos, face, name))

    def predict_files(self, model: torch.nn.Module, paths: Sequence[Path],
                      out_dir: Path) -> Iterator[tuple[Path, str | Exception]]:
        """Segment mesh files (.obj, .off, .ply, .stl): per mesh
        ``OUT/NAME.ply`` (faces coloured by part), ``NAME.png`` (a
        rendering) and ``NAME.txt`` (a label per face), NAME the file's stem
        (see :func:`output_names`); a file that is no usable mesh yields its
        :class:`~pyg_metric_attn.geometry.MeshError`."""
        for path, name in zip(paths, output_names(paths), strict=True):
            try:
                pos, face = read_mesh(path)
                mesh = self.prepare_mesh(pos, face, path.name)
            except MeshError as error:
                yield path, error
                continue
            labels = self.predict(model, mesh).numpy()
            write_segmented_ply(out_dir / f'{name}.ply', pos, face,
                                label_colors(labels))
            atomic_write_text(out_dir / f'{name}.txt',
                              ''.join(f'{label}\n' for label in labels))
            render_segmentations(out_dir / f'{name}.png', mesh.pos.numpy(), face,
                                 [labels], [f'{path.name}: prediction'],
                                 BODY_PARTS)
            yield path, f'{out_dir}/{name}.{{ply,png,txt}}'

    def save_example(self, model: torch.nn.Module, out_dir: Path,
                     index: int = 0) -> list[Path]:
        """``segmentation.png`` (truth vs prediction) and ``prediction.ply`` of
        one evaluation mesh."""
        mesh = self.datasets()[1][index]
        predicted = self.predict(model, mesh).numpy()
        pos, face = mesh.pos.numpy(), mesh.face.t().numpy()
        accuracy = (predicted == mesh.y.numpy()).mean()
        render_segmentations(out_dir / 'segmentation.png', pos, face,
                             [mesh.y.numpy(), predicted],
                             ['ground truth', f'prediction ({100 * accuracy:.1f}%)'],
                             BODY_PARTS)
        write_segmented_ply(out_dir / 'prediction.ply', pos, face,
                            label_colors(predicted))
        return [out_dir / 'segmentation.png', out_dir / 'prediction.ply']


def output_names(paths: Sequence[Path]) -> list[str]:
    """Distinct output names of mesh files: the file's stem, with its
    extension where stems repeat (``a.obj``, ``a.stl`` -> ``a-obj``,
    ``a-stl``), then numbered where names still repeat."""
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


def _split_by_source(meshes, prefix: str) -> tuple[Any, Any]:
    """``(meshes whose name does not start with prefix, those that do)``."""
    held_out = torch.tensor([data.name.startswith(prefix) for data in meshes],
                            dtype=torch.bool)
    if not held_out.any() or held_out.all():
        sources = sorted({data.name.split('__')[0] for data in meshes})
        raise ValueError(f"'val_source={prefix}' must name some but not all "
                         f"training meshes (name prefixes; sources here: "
                         f"{sources})")
    return meshes[~held_out], meshes[held_out]
