r"""A metric-attention transformer for mesh vertices: local attention over
mesh edges plus global attention across each whole mesh."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from torch.nn import GELU, Dropout, LayerNorm, Sequential
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import reset
from torch_geometric.typing import Adj, OptTensor

from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.nn.dense import MetricMultiheadAttention
from pyg_metric_attn.nn.heat_diffusion import HeatDiffusion, MeshSpectrum
from pyg_metric_attn.nn.models.model_config import model_config
from pyg_metric_attn.nn.normalization import Normalization, check_normalization
from pyg_metric_attn.nn.pseudo_metric import check_metric
from pyg_metric_attn.nn.spatial_gradient import (
    SpatialGradientFeatures,
    TangentGradient,
)
from pyg_metric_attn.nn.time_scale import TimeScale, resolve_time_scale
from pyg_metric_attn.utils.point_sets import (
    PaddedSets,
    farthest_point_keys,
    farthest_point_sampling,
)


class MetricMeshFormerBlock(torch.nn.Module):
    r"""Pre-norm residual block,

    .. math::
        h &\leftarrow h + W \, \mathrm{HeatDiffusion}(\mathrm{LN}(h))
            \quad (\text{optional}) \\
        h &\leftarrow h + \mathrm{LocalMetricAttn}(\mathrm{LN}(h), E)
            \quad (\text{optional}) \\
        h &\leftarrow h + \mathrm{GlobalMetricAttn}(\mathrm{LN}(h))
            \quad (\text{optional}) \\
        h &\leftarrow h + \mathrm{FFN}(\mathrm{LN}(h)),

    the local step a multi-head :class:`MetricAttentionConv` over the mesh
    edges, the global one a :class:`MetricMultiheadAttention` from every
    vertex to the vertices of its mesh that ``global_keys`` marks (all of
    them when it is :obj:`None`; dense SDPA kernel), the FFN
    ``Linear -> GELU -> Linear`` of width ``2 * channels``; the optional
    first step a :class:`HeatDiffusion` of every channel (learned times)
    followed by a linear map, the mesh's geometry at scales beyond the
    edges. With ``gradients`` the linear map also reads the
    :class:`SpatialGradientFeatures` of the diffused channels (DiffusionNet's
    block), which see directions on the surface, not only distances.

    Args:
        channels (int): Width (divisible by ``heads``).
        heads (int): Heads of both attentions.
        time_scale (float or str): Initial :math:`t` of both attentions, or
            ``'matched'``.
        learn_time_scale (bool): Learn :math:`t`. (default: :obj:`True`)
        dropout (float): Dropout on the residual branches and in the FFN.
            (default: :obj:`0.0`)
        global_attention (bool): Add the global step. (default: :obj:`True`)
        local_attention (bool): Add the local step (without it the block
            reads the mesh's connectivity only through the diffusion and
            gradient steps, discretised operators of the surface, not hops
            along its edges). (default: :obj:`True`)
        metric (str): ``'metric'``, ``'l2'`` or ``'dot'``.
            (default: :obj:`'metric'`)
        diffusion (bool): Add the heat diffusion step. (default: :obj:`False`)
        gradients (bool): Add the gradient features (needs ``diffusion``).
            (default: :obj:`False`)
        normalization (str): The similarity normalisation of both attentions
            (``'row'``, ``'column'``, ``'sinkhorn'`` or ``'global'``: per
            mesh, see :class:`MetricAttentionConv`). (default: :obj:`'row'`)
        sinkhorn_iterations (int): Steps of ``'sinkhorn'``.
            (default: :obj:`3`)

    Shapes:
        - **input:** vertex features :math:`(N, C)`, edge indices
          :math:`(2, E)`, ``batch`` :math:`(N)` *(optional)*
        - **output:** vertex features :math:`(N, C)`
    """
    def __init__(self, channels: int, heads: int, time_scale: float | str,
                 learn_time_scale: bool = True, dropout: float = 0.0,
                 global_attention: bool = True, metric: str = 'metric',
                 diffusion: bool = False, gradients: bool = False,
                 normalization: str = 'row', sinkhorn_iterations: int = 3,
                 local_attention: bool = True):
        super().__init__()
        if channels % heads:
            raise ValueError(f"'channels' ({channels}) must be divisible by "
                             f"'heads' ({heads})")
        if gradients and not diffusion:
            raise ValueError("'gradients' takes the gradients of the diffused "
                             "features: it needs 'diffusion=True'")
        self.norm_diffusion = LayerNorm(channels) if diffusion else None
        self.diffusion = HeatDiffusion(channels) if diffusion else None
        self.gradient_features = (SpatialGradientFeatures(channels)
                                  if gradients else None)
        self.lin_diffusion = (Linear((2 if gradients else 1) * channels, channels)
                              if diffusion else None)
        self.norm_local = LayerNorm(channels) if local_attention else None
        normalize = dict(normalization=normalization,
                         sinkhorn_iterations=sinkhorn_iterations)
        self.local = MetricAttentionConv(
            channels, channels // heads, heads=heads, metric=metric,
            time_scale=time_scale, learn_time_scale=learn_time_scale,
            **normalize) if local_attention else None
        self.norm_global = LayerNorm(channels) if global_attention else None
        # The global step measures distances at the local step's metric
        # width (the head width), not MetricMultiheadAttention's default of
        # one less (a flash-native augmented width).
        self.global_attention = MetricMultiheadAttention(
            channels, heads, metric=metric, time_scale=time_scale,
            learn_time_scale=learn_time_scale, metric_channels=channels // heads,
            **normalize) if global_attention else None
        self.norm_ffn = LayerNorm(channels)
        self.ffn = Sequential(Linear(channels, 2 * channels), GELU(),
                              Dropout(dropout), Linear(2 * channels, channels))
        self.dropout = Dropout(dropout)

    def reset_parameters(self) -> None:
        for child in self.children():
            reset(child)

    def forward(self, h: Tensor, edge_index: Adj, batch: OptTensor,
                spectrum: MeshSpectrum | None = None,
                gradient: TangentGradient | None = None,
                global_keys: PaddedSets | Tensor | None = None) -> Tensor:
        """``gradient``: the meshes' tangent gradient operators, needed with
        ``gradients``; ``global_keys``: the vertices the global step attends
        to, a boolean mask ``[N]`` or its
        :class:`~pyg_metric_attn.utils.point_sets.PaddedSets` (found once for
        all blocks; :obj:`None`: all vertices)."""
        if self.diffusion is not None:
            if spectrum is None:
                raise ValueError("A block with diffusion needs the meshes' "
                                 "spectrum (evecs, evals, mass): preprocess "
                                 "them with MeshPreprocessing(spectral_basis="
                                 "m > 0)")
            diffused = self.diffusion.diffuse(self.norm_diffusion(h), spectrum)
            if self.gradient_features is not None:
                if gradient is None:
                    raise ValueError("A block with gradients needs the meshes' "
                                     "'grad_index' and 'grad_weight': "
                                     "preprocess them with MeshPreprocessing("
                                     "gradients=True)")
                diffused = torch.cat([diffused, self.gradient_features(
                    gradient.apply(diffused))], dim=-1)
            h = h + self.dropout(self.lin_diffusion(diffused))
        if self.local is not None:
            # 'global' normalises the local weights per mesh of the batch.
            meshes = ({'batch': batch} if batch is not None
                      and self.local.normalization == 'global' else {})
            h = h + self.dropout(self.local(self.norm_local(h), edge_index,
                                            **meshes))
        if self.global_attention is not None:
            h = h + self.dropout(self._global(self.norm_global(h), batch,
                                              global_keys))
        return h + self.dropout(self.ffn(self.norm_ffn(h)))

    def _global(self, h: Tensor, batch: OptTensor,
                global_keys: PaddedSets | Tensor | None) -> Tensor:
        if global_keys is None:
            return self.global_attention.forward_point_sets(h, batch)
        if isinstance(global_keys, Tensor):
            global_keys = PaddedSets.of(global_keys, batch)
        keys = global_keys.keys(h)  # [B, S, C]
        out, _ = self.global_attention(global_keys.queries(h), keys, keys,
                                       key_padding_mask=global_keys.key_padding,
                                       need_weights=False)
        return global_keys.unpad(out)


@dataclass(frozen=True)
class MetricMeshFormerConfig:
    r"""The architecture of a :class:`MetricMeshFormer`: everything but its
    input and output widths (nanoGPT's ``GPTConfig``).

    The heat-kernel logits :math:`-\|\phi(h_i) - \phi(h_j)\|^2 / t` of
    layer-normalised features have squared distances of order :math:`2D`
    for :math:`D` = ``hidden_channels / heads`` dimensions per head, so the
    default :math:`t` starts at :math:`2D` (logits of order one, where the
    paper's :math:`t = 1` would make each vertex attend almost only to
    itself; see :mod:`~pyg_metric_attn.nn.time_scale`) and is learned.

    Args:
        hidden_channels (int): Width. (default: :obj:`128`)
        num_layers (int): Blocks. (default: :obj:`4`)
        heads (int): Attention heads (dividing ``hidden_channels``).
            (default: :obj:`4`)
        time_scale (float or str, optional): Initial :math:`t`, or
            ``'matched'`` (:math:`2\sqrt{D}`, the logit scale of scaled
            dot-product attention). (default: :obj:`None`: :math:`2D`)
        learn_time_scale (bool): Learn :math:`t`. (default: :obj:`True`)
        dropout (float): Dropout on the residual branches and in the FFN.
            (default: :obj:`0.0`)
        global_attention (bool): Add the global step. (default: :obj:`True`)
        local_attention (bool): Add the local step over the mesh edges.
            (default: :obj:`True`)
        metric (str): The pseudo-metric of both attentions.
            (default: :obj:`'metric'`)
        global_stride (int): Global attention attends to one in every
            ``global_stride`` vertices of each mesh, chosen by
            :func:`~pyg_metric_attn.utils.point_sets.farthest_point_sampling`
            of the positions (so the choice does not depend on the vertex
            numbering); :meth:`MetricMeshFormer.forward` then needs ``pos``,
            or the meshes' ``farthest_point_rank`` (from
            :class:`~pyg_metric_attn.transforms.MeshPreprocessing`), which
            gives the same vertices without sampling them in every pass.
            (default: :obj:`1`: all vertices)
        diffusion (bool): Start every block with a learned-time
            :class:`~pyg_metric_attn.nn.HeatDiffusion`; the forward pass then
            needs the meshes' ``evecs``, ``evals`` and ``mass``.
            (default: :obj:`False`)
        gradients (bool): Add spatial gradient features of the diffused
            channels (needs ``diffusion``); the forward pass then needs the
            meshes' ``grad_index`` and ``grad_weight``. (default: :obj:`False`)
        normalization (str): The similarity normalisation of both attentions:
            ``'row'`` (softmax), ``'column'``, ``'sinkhorn'`` or ``'global'``
            (see :class:`MetricAttentionConv`). (default: :obj:`'row'`)
        sinkhorn_iterations (int): Column-then-row steps of ``'sinkhorn'``.
            (default: :obj:`3`)
    """
    hidden_channels: int = 128
    num_layers: int = 4
    heads: int = 4
    time_scale: float | Literal['matched'] | None = None
    learn_time_scale: bool = True
    dropout: float = 0.0
    global_attention: bool = True
    metric: str = 'metric'
    global_stride: int = 1
    diffusion: bool = False
    gradients: bool = False
    normalization: Normalization = 'row'
    sinkhorn_iterations: int = 3
    local_attention: bool = True

    def __post_init__(self) -> None:
        for name in ('hidden_channels', 'num_layers', 'heads', 'global_stride'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"'{name}' must be a positive integer, got "
                                 f"{value!r}")
        if self.hidden_channels % self.heads:
            raise ValueError(f"'hidden_channels' ({self.hidden_channels}) must "
                             f"be divisible by 'heads' ({self.heads})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"'dropout' must be in [0, 1), got {self.dropout!r}")
        check_metric(self.metric)
        check_normalization(self.normalization, self.sinkhorn_iterations)
        if self.time_scale is not None:
            TimeScale(resolve_time_scale(self.time_scale, self.metric,
                                         self.hidden_channels // self.heads))


class MetricMeshFormer(torch.nn.Module):
    r"""``Linear`` :math:`\to` ``num_layers`` :class:`MetricMeshFormerBlock`
    :math:`\to` ``LayerNorm`` :math:`\to` ``Linear``: per-vertex logits.

    Args:
        in_channels (int): Input features per vertex.
        out_channels (int): Outputs per vertex (e.g. classes).
        config (MetricMeshFormerConfig, optional): The architecture.
            (default: :obj:`MetricMeshFormerConfig()`)
        **kwargs (optional): Fields of :class:`MetricMeshFormerConfig` that
            replace those of ``config``, e.g. ``hidden_channels=64``.
    """
    #: The keyword arguments of :meth:`forward` that a batch of meshes
    #: prepared by :class:`~pyg_metric_attn.transforms.MeshPreprocessing`
    #: carries under the same names (how a task feeds any mesh model).
    mesh_inputs = ('edge_index', 'batch', 'evecs', 'evals', 'mass',
                   'grad_index', 'grad_weight', 'pos', 'farthest_point_rank')

    def __init__(self, in_channels: int, out_channels: int,
                 config: MetricMeshFormerConfig | None = None, **kwargs: Any):
        super().__init__()
        config = model_config(MetricMeshFormerConfig, config, kwargs,
                              'MetricMeshFormer')
        self.config = config
        self.in_channels, self.out_channels = in_channels, out_channels
        self.global_stride = (config.global_stride if config.global_attention
                              else 1)
        time_scale = config.time_scale
        if time_scale is None:  # squared distances of layer-normed features
            time_scale = 2.0 * config.hidden_channels / config.heads
        self.lin_in = Linear(in_channels, config.hidden_channels)
        self.blocks = torch.nn.ModuleList([
            MetricMeshFormerBlock(
                config.hidden_channels, config.heads, time_scale,
                learn_time_scale=config.learn_time_scale,
                dropout=config.dropout, metric=config.metric,
                global_attention=config.global_attention,
                local_attention=config.local_attention,
                diffusion=config.diffusion, gradients=config.gradients,
                normalization=config.normalization,
                sinkhorn_iterations=config.sinkhorn_iterations)
            for _ in range(config.num_layers)
        ])
        self.norm_out = LayerNorm(config.hidden_channels)
        self.lin_out = Linear(config.hidden_channels, out_channels)

    def reset_parameters(self) -> None:
        for child in self.children():
            reset(child)

    def forward(self, x: Tensor, edge_index: Adj, batch: OptTensor = None,
                evecs: OptTensor = None, evals: OptTensor = None,
                mass: OptTensor = None, grad_index: OptTensor = None,
                grad_weight: OptTensor = None, pos: OptTensor = None,
                farthest_point_rank: OptTensor = None) -> Tensor:
        """``pos``: vertex positions ``[N, 3]``, or ``farthest_point_rank``:
        their :func:`~pyg_metric_attn.utils.point_sets.farthest_point_ranks`
        ``[N]`` (int64) in each mesh, needed with ``global_stride > 1``
        (the ranks are read where both are given)."""
        spectrum = None  # prepared once, shared by every block's diffusion
        if evecs is not None and evals is not None and mass is not None:
            spectrum = MeshSpectrum.from_batch(evecs, evals, mass, batch)
        gradient = None  # checked once, shared by every block
        if grad_index is not None and grad_weight is not None:
            gradient = TangentGradient.from_batch(grad_index, grad_weight,
                                                  x.size(0))
        global_keys = None  # found and laid out once, shared by every block
        if self.global_stride > 1:
            if farthest_point_rank is not None:
                if farthest_point_rank.shape != (x.size(0),):
                    raise ValueError(f"'farthest_point_rank' must have shape "
                                     f"[{x.size(0)}] (one per vertex), got "
                                     f"{list(farthest_point_rank.shape)}")
                global_keys = farthest_point_keys(farthest_point_rank, batch,
                                                  self.global_stride)
            elif pos is None:
                raise ValueError(f"'global_stride={self.global_stride}' picks "
                                 f"the attended vertices from their positions: "
                                 f"pass 'pos' or 'farthest_point_rank'")
            else:
                global_keys = farthest_point_sampling(pos, batch,
                                                      self.global_stride)
            global_keys = PaddedSets.of(global_keys, batch)
        h = self.lin_in(x)
        for block in self.blocks:
            h = block(h, edge_index, batch, spectrum, gradient, global_keys)
        return self.lin_out(self.norm_out(h))

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, {self.config})')
