r"""Human-body mesh segmentation: per-face part labels from per-vertex
attention models (the paper's Figure 5 setting, extended).

Models run on the mesh's vertex graph and predict per vertex; each face takes
the mean of its three vertices' logits (the paper's fixed linear aggregation)
and the loss is the cross entropy over faces. ``attention`` names the model:
the paper's IPN with ``'metric'``, ``'l2'``, ``'dot'`` (this library's
:class:`~pyg_metric_attn.nn.MetricAttentionConv`) or PyG's ``'gat'``,
``'gatv2'``, ``'transformer'`` in the same slots, or ``'metricformer'``,
:class:`~pyg_metric_attn.nn.models.MetricMeshFormer` (local plus global
metric-attention with residual feed-forward blocks; its learning rate follows a
cosine schedule to zero over the epochs unless ``former_cosine=False``; every
block starts with a learned-time heat diffusion over the mesh, for which the
meshes carry their ``k`` eigenpairs, unless ``former_diffusion=False``; and
DiffusionNet's spatial gradient features of the diffused channels, from
tangent gradient operators the meshes carry, unless
``former_gradients=False``).

Data: the MeshCNN human_seg benchmark where ``root`` is given (raw files as
:class:`~pyg_metric_attn.datasets.HumanSegmentation` reads them), else
:class:`~pyg_metric_attn.datasets.SyntheticHumans` (offline). Inputs are the
16 heat kernel signatures per vertex (``features='hks'``) or the normalised
coordinates with a uniformly random rotation of every training mesh
(``features='xyz'``). With ``hks_time_jitter=J > 1`` every training mesh's HKS
are recomputed each step at diffusion times stretched by a factor drawn
log-uniformly from ``[1/J, J]`` (a random size change of the mesh; needs the
eigenpairs the former's diffusion carries). ``label_smoothing > 0`` smooths
the training targets (:meth:`HumanSegTask.training_loss`; evaluation losses
stay plain cross entropy). With ``val_fraction > 0`` a seeded share of the
training meshes is held out and evaluated instead of the test set (for tuning
without the test set); with ``val_source=PREFIX`` the training meshes whose
names start with ``PREFIX`` are (e.g. ``adobe``: a whole source of the
benchmark, so that validation sees people the training did not, as the test
set does). Otherwise the test set is evaluated after every epoch and the last
epoch is reported (no model selection on the test set).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch_geometric.loader import DataLoader

from pyg_metric_attn.datasets import BODY_PARTS, HumanSegmentation, SyntheticHumans
from pyg_metric_attn.datasets.mesh_dataset import mesh_data
from pyg_metric_attn.datasets.mesh_io import write_segmented_ply
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn.models import ATTENTIONS, IPN, MetricMeshFormer
from pyg_metric_attn.training.distributed import (
    DistributedContext,
    shard_indices,
    strided_share,
    unwrap,
)
from pyg_metric_attn.training.segmentation import SegmentationMeter, face_logits
from pyg_metric_attn.training.trainer import Trainer, seed_everything
from pyg_metric_attn.transforms import (
    MeshPreprocessing,
    random_rotation,
    rescaled_heat_kernel_signatures,
)
from pyg_metric_attn.visualization import label_colors, render_segmentations

STRONG_MODEL = 'metricformer'
MODELS = (*ATTENTIONS, STRONG_MODEL)
METRIC_ATTENTIONS = ('metric', 'l2', 'dot')


class HumanSegTask(Task):
    """Human mesh segmentation (MeshCNN human_seg, or synthetic humanoids)."""
    name = 'human_seg'
    default_attentions = ('metric', 'l2', 'dot', 'gat', 'gatv2', 'transformer')
    final_metric = 'test_face_acc'
    curve_metrics = ('train_loss', 'test_face_acc')
    default_epochs = 100
    defaults: dict[str, Any] = dict(
        # The paper's IPN (Table 2): d_Q = d_mlp = 64, Adam lr 1e-3, wd 1e-4.
        hidden=64, mlp_channels=64, num_layers=2, heads=1, lr=1e-3,
        weight_decay=1e-4, batch_size=8,
        # Heat-kernel time t of metric/l2/dot: a float or {attention: t}.
        time_scale=1.0, learn_time_scale=False,
        # metric/l2/dot only: a value map W_v (H' = S H W_v) and a linear map
        # of the vertex's own features added (TransformerConv's root weight).
        value=False, residual=False,
        features='hks', hks_time_jitter=1.0, label_smoothing=0.0,
        val_fraction=0.0, val_source=None, data_seed=0,
        # MetricMeshFormer ('metricformer').
        former_hidden=64, former_layers=4, former_heads=4, former_dropout=0.1,
        former_global=True, former_global_stride=8, former_cosine=True,
        former_diffusion=True, former_gradients=True,
        # Data.
        root=None, processed_dir=None, synthetic_root='datasets/synthetic_humans',
        synthetic_train=120, synthetic_test=30, k=128, hks_count=16,
        num_workers=2, artifacts=None)

    def __init__(self, epochs: int | None = None, progress: bool = True,
                 **options: Any):
        super().__init__(epochs=epochs, progress=progress, **options)
        options = self.options
        if options['features'] not in ('hks', 'xyz'):
            raise ValueError(f"'features' must be 'hks' or 'xyz', got "
                             f"'{options['features']}'")
        if options['val_fraction'] > 0 and options['val_source']:
            raise ValueError("Set 'val_fraction' or 'val_source', not both")
        if not 0 <= options['label_smoothing'] < 1:
            raise ValueError(f"'label_smoothing' must be in [0, 1), got "
                             f"{options['label_smoothing']}")
        if options['hks_time_jitter'] < 1:
            raise ValueError(f"'hks_time_jitter' must be at least 1, got "
                             f"{options['hks_time_jitter']}")
        if options['hks_time_jitter'] > 1 and not (
                options['features'] == 'hks' and self.spectral_basis):
            raise ValueError("'hks_time_jitter' recomputes HKS from the "
                             "meshes' eigenpairs: it needs features='hks' and "
                             "former_diffusion=True")
        self.eval_split = ('val' if options['val_fraction'] > 0
                           or options['val_source'] else 'test')
        self.final_metric = f'{self.eval_split}_face_acc'
        self.curve_metrics = ('train_loss', self.final_metric)
        #: Every mesh's preprocessing: the data sets' pre_transform and
        #: prepare_mesh's. No operator cache: the processed files hold them.
        self.preprocessing = MeshPreprocessing(
            options['k'], options['hks_count'], self.spectral_basis,
            self.gradients)
        self._data = None

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument('--root', help='MeshCNN human_seg folder (train/, '
                            'test/, seg/, sseg/); default: synthetic humanoids')
        parser.add_argument('--processed-dir', help='where processed files go '
                            '(default: ROOT/processed)')
        parser.add_argument('--features', choices=('hks', 'xyz'))
        parser.add_argument('--artifacts', help='folder for each run\'s '
                            'checkpoints, a coloured .ply and a rendering')

    def config(self) -> dict[str, Any]:
        config = super().config()
        config.pop('artifacts')
        config.pop('num_workers')
        return config

    # Data ------------------------------------------------------------------
    def datasets(self) -> tuple[Any, Any]:
        """``(train meshes, evaluation meshes)`` (evaluation: test or val)."""
        if self._data is None:
            o = self.options
            common = dict(pre_transform=self.preprocessing,
                          num_workers=o['num_workers'], log=self.progress)
            if o['root']:
                train = HumanSegmentation(o['root'], 'train',
                                          processed_dir=o['processed_dir'],
                                          **common)
                test = HumanSegmentation(o['root'], 'test',
                                         processed_dir=o['processed_dir'],
                                         **common)
            else:
                train = SyntheticHumans(o['synthetic_root'], 'train',
                                        o['synthetic_train'], **common)
                test = SyntheticHumans(o['synthetic_root'], 'test',
                                       o['synthetic_test'], **common)
            if o['val_source']:
                train, test = _split_by_source(train, o['val_source'])
            elif self.eval_split == 'val':
                generator = torch.Generator().manual_seed(o['data_seed'])
                order = torch.randperm(len(train), generator=generator)
                num_val = max(1, round(o['val_fraction'] * len(train)))
                train, test = train[order[num_val:]], train[order[:num_val]]
            self._data = train, test
        return self._data

    @property
    def spectral_basis(self) -> int:
        """Eigenpairs each mesh carries: all ``k`` for the former's heat
        diffusion, else none."""
        return self.options['k'] if self.options['former_diffusion'] else 0

    @property
    def gradients(self) -> bool:
        """Whether the meshes carry tangent gradient operators (for the
        former's gradient features)."""
        return bool(self.options['former_diffusion']
                    and self.options['former_gradients'])

    def inputs(self, batch, augment: bool = False) -> torch.Tensor:
        """The model input per vertex; when augmenting, coordinates are
        rotated and HKS rescaled in time (``hks_time_jitter``)."""
        if self.options['features'] == 'hks':
            jitter = self.options['hks_time_jitter']
            if not augment or jitter == 1:
                return batch.hks
            log_scale = (2 * torch.rand(batch.num_graphs) - 1) * math.log(jitter)
            return rescaled_heat_kernel_signatures(
                batch.evals, batch.evecs, batch.batch,
                log_scale.exp().to(batch.evals.dtype), batch.hks.size(1))
        if not augment:
            return batch.pos
        rotations = torch.stack([random_rotation() for _ in
                                 range(batch.num_graphs)]).to(batch.pos.dtype)
        return torch.einsum('vij,vj->vi', rotations[batch.batch], batch.pos)

    # Model -----------------------------------------------------------------
    def build_model(self, attention: str) -> torch.nn.Module:
        o = self.options
        in_channels = o['hks_count'] if o['features'] == 'hks' else 3
        if attention == STRONG_MODEL:
            return MetricMeshFormer(in_channels, o['former_hidden'],
                                    len(BODY_PARTS), o['former_layers'],
                                    o['former_heads'],
                                    dropout=o['former_dropout'],
                                    global_attention=o['former_global'],
                                    global_stride=o['former_global_stride'],
                                    diffusion=o['former_diffusion'],
                                    gradients=self.gradients)
        if attention not in ATTENTIONS:
            raise ValueError(f"Unknown model '{attention}'; expected one of "
                             f"{MODELS}")
        kwargs = {}
        if attention in METRIC_ATTENTIONS:
            time_scale = o['time_scale']
            if isinstance(time_scale, dict):
                time_scale = time_scale[attention]
            kwargs = dict(mlp_channels=o['mlp_channels'], time_scale=time_scale,
                          learn_time_scale=o['learn_time_scale'],
                          value=o['value'], residual=o['residual'])
        return IPN(in_channels, o['hidden'], len(BODY_PARTS), o['num_layers'],
                   attention=attention, heads=o['heads'], **kwargs)

    def forward(self, model: torch.nn.Module, batch, augment: bool = False):
        """Per-vertex logits of a batch of meshes."""
        x = self.inputs(batch, augment)
        if isinstance(unwrap(model), MetricMeshFormer):
            keys = (('evecs', 'evals', 'mass') if self.spectral_basis else ())
            keys += ('grad_index', 'grad_weight') if self.gradients else ()
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
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for batch in DataLoader(meshes, batch_size or
                                    self.options['batch_size']):
                logits = self.forward(model, batch)
                loss = F.cross_entropy(face_logits(logits, batch.face), batch.y)
                meter.update(logits, batch, loss)
        model.train(was_training)
        if context.is_distributed:
            shares = context.gather_objects(meter)
            meter = SegmentationMeter(len(BODY_PARTS))
            for share in shares:
                meter.merge(share)
        return meter

    # Training --------------------------------------------------------------
    def training_loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        r"""Cross entropy over the faces of augmented inputs; with
        ``label_smoothing`` :math:`\varepsilon` each face's target puts
        :math:`1 - \varepsilon` on its label and spreads :math:`\varepsilon`
        evenly over all classes."""
        logits = face_logits(self.forward(model, batch, augment=True), batch.face)
        return F.cross_entropy(logits, batch.y,
                               label_smoothing=self.options['label_smoothing'])

    def fit(self, attention: str, seed: int, out_dir: str | Path | None = None,
            resume: bool = False,
            before_training: Callable[[], None] | None = None,
            distributed: DistributedContext | None = None
            ) -> tuple[torch.nn.Module, Trainer]:
        """Train one model with :class:`~pyg_metric_attn.training.Trainer`
        (checkpoints and metrics in ``out_dir`` when given; ``resume``: from
        its last checkpoint). ``before_training`` is called once the resume
        is known to be valid, before anything is written. With several
        processes (``distributed``) each rank trains on its share of the
        meshes (``batch_size`` per rank), draws its own augmentations, and
        evaluates its share of the evaluation meshes."""
        o = self.options
        context = distributed or DistributedContext()
        train, evaluation = self.datasets()
        seed_everything(seed)
        model = self.build_model(attention)
        if context.is_distributed:
            seed_everything(context.rank_seed(seed))
        optimizer = torch.optim.Adam(model.parameters(), lr=o['lr'],
                                     weight_decay=o['weight_decay'])
        scheduler = None
        if attention == STRONG_MODEL and o['former_cosine']:
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer,
                                                                   self.epochs)

        def batches(epoch: int):
            if context.is_distributed:
                share = shard_indices(len(train), context, seed, epoch)
                return DataLoader(train, o['batch_size'], sampler=share.tolist())
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            return DataLoader(train, o['batch_size'], shuffle=True,
                              generator=generator)

        def evaluate(model: torch.nn.Module) -> dict[str, float]:
            return self.evaluate(model, evaluation, distributed=context
                                 ).compute(f'{self.eval_split}_')

        trainer = Trainer(model, optimizer, self.training_loss, evaluate,
                          scheduler=scheduler, out_dir=out_dir,
                          progress=self.progress,
                          desc=f'human_seg {attention} seed {seed}',
                          distributed=context)
        if resume:
            trainer.resume(self.epochs)
        if before_training is not None:
            before_training()
        trainer.fit(batches, self.epochs)
        return model, trainer

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        artifacts = self.options['artifacts']
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

    def predict(self, model: torch.nn.Module, mesh) -> torch.Tensor:
        """Predicted face labels of one processed mesh."""
        model.eval()
        with torch.no_grad():
            return face_logits(self.forward(model, mesh), mesh.face).argmax(-1)

    def prepare_mesh(self, pos, face, name: str):
        """A mesh as read from its file, processed as the training meshes
        were (:attr:`preprocessing`)."""
        return self.preprocessing(mesh_data(pos, face, name))

    def save_example(self, model: torch.nn.Module, out_dir: Path,
                     index: int = 0) -> None:
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
