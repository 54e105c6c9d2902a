r"""Human-body mesh segmentation: per-face part labels from per-vertex
models (the paper's Figure 5 setting, extended).

Models run on the mesh's vertex graph and predict per vertex; each face takes
the mean of its three vertices' logits (the paper's fixed linear aggregation)
and the loss is the cross entropy over faces. ``attention`` names the model:

* ``'metricformer'`` (the default),
  :class:`~pyg_metric_attn.nn.models.MetricMeshFormer`: local plus global
  metric-attention with heat diffusion and spatial gradient features in every
  block (configured by ``former``, set as ``former_FIELD``), its learning rate
  on a cosine schedule to zero over the epochs;
* ``'diffusionnet'``, the baseline
  :class:`~pyg_metric_attn.nn.models.DiffusionNet` (configured by
  ``diffusionnet``, set as ``diffusionnet_FIELD``), its learning rate halved
  every 50 epochs, as its paper's recipe;
* the paper's IPN with ``'metric'``, ``'l2'``, ``'dot'`` (this library's
  :class:`~pyg_metric_attn.nn.MetricAttentionConv`) or PyG's ``'gat'``,
  ``'gatv2'``, ``'transformer'`` in the same slots.

The config's defaults are the recipe of the reported MetricMeshFormer (200
epochs, no weight decay, one mesh per step, every training mesh drawn each
epoch from itself and one perturbed copy per kind of
``augment_perturbations``, the operators of every mesh computed after two
Taubin smoothing rounds, a tenth of the training meshes held out for
validation): ``pyg-metric-attn train human_seg --root PATH`` trains it.

Data: the MeshCNN human_seg benchmark where ``root`` is given (raw files as
:class:`~pyg_metric_attn.datasets.HumanSegmentation` reads them), else
:class:`~pyg_metric_attn.datasets.SyntheticHumans` (offline). Inputs are the
16 heat kernel signatures per vertex (``features='hks'``) or the normalised
coordinates, every training mesh rotated at random (``features='xyz'``).
With ``val_fraction > 0`` a seeded share of the training meshes is held out
and evaluated after every epoch (a reading: the model is the last epoch's);
the test split is read once, at the end of an experiment or by ``evaluate
--split test``. With ``val_fraction=0`` the test set is evaluated after
every epoch and the last epoch is reported (no model selection on the test
set).
"""
from __future__ import annotations

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
from pyg_metric_attn.datasets.mesh_io import write_segmented_ply
from pyg_metric_attn.experiments.attention import (
    ATTENTIONS,
    attention_factory,
    metric_options,
)
from pyg_metric_attn.experiments.config import TaskConfig, setting
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.geometry import PERTURBATIONS, random_rotation
from pyg_metric_attn.geometry.perturbations import distinct_copy_seeds
from pyg_metric_attn.nn.models import (
    IPN,
    DiffusionNet,
    DiffusionNetConfig,
    MetricMeshFormer,
    MetricMeshFormerConfig,
    mesh_forward,
)
from pyg_metric_attn.pretrained.segmenter import MeshSegmenter
from pyg_metric_attn.training import (
    DistributedContext,
    Trainer,
    epoch_generator,
    eval_mode,
    seed_everything,
    shard_indices,
    strided_share,
)
from pyg_metric_attn.training.segmentation import SegmentationMeter, face_logits
from pyg_metric_attn.transforms import MeshPreprocessing
from pyg_metric_attn.utils.data_home import data_home
from pyg_metric_attn.visualization import label_colors, render_segmentations

STRONG_MODEL = 'metricformer'
BASELINE_MODEL = 'diffusionnet'
MODELS = (*ATTENTIONS, STRONG_MODEL, BASELINE_MODEL)


def default_former() -> MetricMeshFormerConfig:
    """The recipe's former: 64 wide, 4 blocks of 4 heads, dropout 0.1,
    global attention to every 8th vertex, heat diffusion and gradient
    features."""
    return MetricMeshFormerConfig(hidden_channels=64, num_layers=4, heads=4,
                                  dropout=0.1, global_stride=8, diffusion=True,
                                  gradients=True)


@dataclass(frozen=True)
class HumanSegConfig(TaskConfig):
    """The human_seg task's settings; the defaults are the recipe of the
    reported MetricMeshFormer (see the module docstring)."""
    # Training.
    lr: float = setting(1e-3, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    batch_size: int = setting(1, ge=1)
    #: Geometric augmentation: perturbed copies of every training mesh, one
    #: per kind of ``augment_perturbations`` (a kind that draws at random
    #: gets ``augment_copies`` of them).
    augment_copies: int = setting(1, ge=0)
    augment_perturbations: str = 'subdivision,decimation,anisotropic_scaling,jitter'
    #: Taubin smoothing rounds of every mesh before its operators
    #: (MeshPreprocessing's smoothing).
    mesh_smoothing: int = setting(2, ge=0)
    #: The share of the training meshes held out for validation (drawn
    #: with ``data_seed``).
    val_fraction: float = setting(0.1, ge=0, lt=1)
    data_seed: int = 0
    features: Literal['hks', 'xyz'] = 'hks'
    # Models.
    #: MetricMeshFormer ('metricformer').
    former: MetricMeshFormerConfig = setting(default_factory=default_former)
    #: DiffusionNet ('diffusionnet'; default: the paper's 4 blocks x 128,
    #: dropout 0.5).
    diffusionnet: DiffusionNetConfig = setting(default_factory=DiffusionNetConfig)
    #: The IPN ('metric', 'l2', 'dot', 'gat', ...; the paper's Table 2:
    #: d_Q = d_mlp = 64): width, metric MLP width, layers, heads, the
    #: heat-kernel time t of metric/l2/dot (a number, 'matched' or
    #: {attention: t}) and the normalisation of their similarities.
    hidden: int = setting(64, ge=1)
    mlp_channels: int = setting(64, ge=1)
    num_layers: int = setting(2, ge=1)
    heads: int = setting(1, ge=1)
    time_scale: float | Literal['matched'] | dict[str, float] = setting(1.0, gt=0)
    normalization: Literal['row', 'column', 'sinkhorn'] = 'row'
    sinkhorn_iterations: int = setting(3, ge=1)
    # Data.
    root: str | None = None
    processed_dir: str | None = None
    #: Synthetic humanoids (without ``root``), in ``processed_dir``, else
    #: :func:`~pyg_metric_attn.utils.data_home.data_home` ``/synthetic_humans``.
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
        unknown = set(self.augmentations) - set(PERTURBATIONS)
        if unknown or not self.augmentations:
            raise ValueError(f"'augment_perturbations' must name some of "
                             f"{', '.join(PERTURBATIONS)} (comma-separated), "
                             f"got {self.augment_perturbations!r}")

    @property
    def augmentations(self) -> list[str]:
        """The perturbations of ``augment_perturbations``."""
        return [name for name in self.augment_perturbations.split(',') if name]


#: The defaults of version 1 of the config (up to commit c539c4e) that the
#: recipe has changed.
VERSION_1_DEFAULTS = dict(weight_decay=1e-4, batch_size=8, augment_copies=0,
                          augment_perturbations='decimation,anisotropic_scaling,'
                                                'jitter',
                          mesh_smoothing=0, val_fraction=0.0)
#: Options of version 1 that are gone, all last in commit c539c4e.
RETIRED_OPTIONS = {name: 'c539c4e' for name in (
    'metric_mlp_weight_decay', 'learn_time_scale', 'value', 'residual',
    'xyz_rotation', 'xyz_scaling', 'hks_time_jitter', 'hks_min_time',
    'mesh_area', 'label_smoothing', 'corner_loss', 'val_source',
    'former_cosine', 'step_lr_epochs', 'synthetic_root',
    'former_diffusion_time_floor')}


class HumanSegTask(Task):
    """Human mesh segmentation (MeshCNN human_seg, or synthetic humanoids)."""
    name = 'human_seg'
    default_attentions = (STRONG_MODEL,)
    final_metric = 'test_face_acc'
    curve_metrics = ('train_loss', 'test_face_acc')
    default_epochs = 200
    splits = ('test', 'val', 'train')
    config_class = HumanSegConfig
    config_version = 2
    earlier_defaults = {1: VERSION_1_DEFAULTS}
    retired_options = RETIRED_OPTIONS
    config: HumanSegConfig

    def __init__(self, config: HumanSegConfig | None = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        c = self.config
        #: The meshes evaluated after every epoch: the validation meshes held
        #: out of the training meshes, or without them the test meshes.
        self.eval_split = 'val' if c.val_fraction > 0 else 'test'
        self.curve_metrics = ('train_loss', f'{self.eval_split}_face_acc')
        #: Every mesh's preprocessing: the data sets' pre_transform and
        #: the segmenter's. No operator cache: the processed files hold them.
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
    def datasets(self) -> tuple[Any, Any, Any]:
        """``(train meshes, validation meshes or None, test meshes)``, the
        validation meshes held out of the training meshes with
        ``val_fraction``."""
        if self._data is None:
            c = self.config
            if not c.root:
                print(f'synthetic humanoids in {self.synthetic_root}')
            train, test = self.split_meshes('train'), self.split_meshes('test')
            val = None
            if c.val_fraction > 0:
                generator = torch.Generator().manual_seed(c.data_seed)
                order = torch.randperm(len(train), generator=generator)
                num_val = max(1, round(c.val_fraction * len(train)))
                if num_val >= len(train):
                    raise ValueError(f"'val_fraction={c.val_fraction}' holds "
                                     f"out {num_val} of the {len(train)} "
                                     f"training meshes: none would be left "
                                     f"to train on")
                train, val = train[order[num_val:]], train[order[:num_val]]
            self._data = train, val, test
        return self._data

    def meshes(self, split: str) -> Any:
        """The processed meshes of ``'train'`` (without the validation
        meshes), ``'val'`` or ``'test'``."""
        train, val, test = self.datasets()
        if split == 'val' and val is None:
            raise ValueError("No validation meshes: the run held none out of "
                             "the training meshes ('-o val_fraction=0'); "
                             "score the test split")
        try:
            return {'train': train, 'val': val, 'test': test}[split]
        except KeyError:
            raise ValueError(f"'split' must be one of {self.splits}, got "
                             f"{split!r}") from None

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
        self.augmented(self.meshes('train'))

    @property
    def synthetic_root(self) -> Path:
        """Folder of the synthetic humanoids: ``processed_dir``, else
        ``DATA_HOME/synthetic_humans`` (``DATA_HOME``:
        ``$PYG_METRIC_ATTN_DATA``, default ``~/.cache/pyg-metric-attn``)."""
        return Path(self.config.processed_dir or data_home() / 'synthetic_humans')

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

    def inputs(self, batch, augment: bool = False) -> torch.Tensor:
        """The model input per vertex: the HKS, or the coordinates, each
        mesh rotated at random when augmenting."""
        if self.config.features == 'hks':
            return batch.hks
        if not augment:
            return batch.pos
        rotations = torch.stack([random_rotation()
                                 for _ in range(batch.num_graphs)])
        return torch.einsum('vij,vj->vi',
                            rotations.to(batch.pos)[batch.batch], batch.pos)

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
        conv = attention_factory(  # the paper's propagation H' = S H: no value map
            attention, heads=c.heads, concat=False,
            **metric_options(attention, value=False, mlp_channels=c.mlp_channels,
                             time_scale=time_scale,
                             normalization=c.normalization,
                             sinkhorn_iterations=c.sinkhorn_iterations))
        return IPN(in_channels, c.hidden, len(BODY_PARTS), c.num_layers,
                   conv=conv)

    def forward(self, model: torch.nn.Module, batch, augment: bool = False):
        """Per-vertex logits of a batch of meshes
        (:func:`~pyg_metric_attn.nn.models.mesh_forward`)."""
        return mesh_forward(model, self.inputs(batch, augment), batch)

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
        confusion matrix on ``'test'``, ``'val'`` (the meshes held out with
        ``val_fraction``) or ``'train'`` (the rest of the training
        meshes)."""
        meter = self.evaluate(model, self.meshes(split))
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
        """Cross entropy over the faces, of augmented inputs."""
        logits = self.forward(model, batch, augment=True)
        return F.cross_entropy(face_logits(logits, batch.face), batch.y)

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Adam:
        """Adam with the config's learning rate and weight decay."""
        return torch.optim.Adam(model.parameters(), lr=self.config.lr,
                                weight_decay=self.config.weight_decay)

    def schedule(self, attention: str, optimizer: torch.optim.Optimizer
                 ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """The learning-rate schedule of the model's recipe: cosine to zero
        over the epochs for the former, halved every 50 epochs for
        DiffusionNet (its paper's), none for the IPN."""
        if attention == STRONG_MODEL:
            return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer,
                                                              self.epochs)
        if attention == BASELINE_MODEL:
            return torch.optim.lr_scheduler.StepLR(optimizer, 50, gamma=0.5)
        return None

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
        train = self.augmented(self.meshes('train'))
        evaluation = self.meshes(self.eval_split)
        seed_everything(seed)
        model = self.placement.move(self.build_model(attention))
        if context.is_distributed:
            seed_everything(context.rank_seed(seed))
        optimizer = self.build_optimizer(model)

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
                          scheduler=self.schedule(attention, optimizer),
                          out_dir=out_dir, progress=self.progress,
                          desc=f'human_seg {attention} seed {seed}',
                          distributed=context, placement=self.placement)
        trainer.fit(batches, self.epochs, resume, before_training)
        return model, trainer

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        """Trains, then reads the test meshes once: ``final`` holds the last
        epoch's metrics (of the validation meshes where they are held out)
        and the test metrics with their details."""
        artifacts = self.config.artifacts
        out_dir = (Path(artifacts) / f'{attention}-seed{seed}'
                   if artifacts else None)
        model, trainer = self.fit(attention, seed, out_dir)
        history = trainer.history
        final = {k: v for k, v in history[-1].items()
                 if k.startswith(f'{self.eval_split}_')}
        test = self.evaluate(model, self.meshes('test'))
        final.update(test.compute('test_'))
        final.update(test.details())
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

    def segmenter(self, model: torch.nn.Module) -> MeshSegmenter:
        """``model`` with the preprocessing and inputs of this task's meshes,
        for meshes from files (:class:`~pyg_metric_attn.pretrained.MeshSegmenter`,
        on this task's device)."""
        return MeshSegmenter(self.placement.move(model), self.preprocessing,
                             BODY_PARTS, self.config.features)

    def shipped_model(self) -> MeshSegmenter:
        """The shipped human_seg model (:func:`pyg_metric_attn.pretrained.human_seg`)
        on this task's device."""
        from pyg_metric_attn.pretrained import human_seg

        return human_seg(device=self.placement.device)

    def predict_files(self, model: torch.nn.Module, paths: Sequence[Path],
                      out_dir: Path) -> Iterator[tuple[Path, str | Exception]]:
        """Segment mesh files: :meth:`MeshSegmenter.predict_files
        <pyg_metric_attn.pretrained.MeshSegmenter.predict_files>`."""
        with self.placement.autocast():
            yield from self.segmenter(model).predict_files(paths, out_dir)

    def save_example(self, model: torch.nn.Module, out_dir: Path,
                     index: int = 0) -> list[Path]:
        """``segmentation.png`` (truth vs prediction) and ``prediction.ply`` of
        one evaluation mesh."""
        mesh = self.meshes(self.eval_split)[index]
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
