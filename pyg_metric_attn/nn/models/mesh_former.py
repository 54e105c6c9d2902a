r"""A metric-attention transformer for mesh vertices: local attention over
mesh edges plus global attention across each whole mesh."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import GELU, Dropout, LayerNorm, Sequential
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import Adj, OptTensor
from torch_geometric.utils import to_dense_batch

from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.nn.dense import MetricMultiheadAttention
from pyg_metric_attn.nn.heat_diffusion import HeatDiffusion, MeshSpectrum
from pyg_metric_attn.nn.spatial_gradient import (
    SpatialGradientFeatures,
    TangentGradient,
)
from pyg_metric_attn.utils.point_sets import farthest_point_sampling


class MetricMeshFormerBlock(torch.nn.Module):
    r"""Pre-norm residual block,

    .. math::
        h &\leftarrow h + W \, \mathrm{HeatDiffusion}(\mathrm{LN}(h))
            \quad (\text{optional}) \\
        h &\leftarrow h + \mathrm{LocalMetricAttn}(\mathrm{LN}(h), E) \\
        h &\leftarrow h + \mathrm{GlobalMetricAttn}(\mathrm{LN}(h)) \\
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
    """
    def __init__(self, channels: int, heads: int, time_scale: float,
                 learn_time_scale: bool = True, dropout: float = 0.0,
                 global_attention: bool = True, metric: str = 'metric',
                 diffusion: bool = False, gradients: bool = False):
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
        self.norm_local = LayerNorm(channels)
        self.local = MetricAttentionConv(
            channels, channels // heads, heads=heads, metric=metric,
            time_scale=time_scale, learn_time_scale=learn_time_scale)
        self.norm_global = LayerNorm(channels) if global_attention else None
        self.global_attention = MetricMultiheadAttention(
            channels, heads, metric=metric, time_scale=time_scale,
            learn_time_scale=learn_time_scale) if global_attention else None
        self.norm_ffn = LayerNorm(channels)
        self.ffn = Sequential(Linear(channels, 2 * channels), GELU(),
                              Dropout(dropout), Linear(2 * channels, channels))
        self.dropout = Dropout(dropout)

    def forward(self, h: Tensor, edge_index: Adj, batch: OptTensor,
                spectrum: MeshSpectrum | None = None,
                gradient: TangentGradient | None = None,
                global_keys: OptTensor = None) -> Tensor:
        """``gradient``: the meshes' tangent gradient operators, needed with
        ``gradients``; ``global_keys``: a boolean mask ``[N]`` of the vertices
        the global step attends to (:obj:`None`: all)."""
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
        h = h + self.dropout(self.local(self.norm_local(h), edge_index))
        if self.global_attention is not None:
            h = h + self.dropout(self._global(self.norm_global(h), batch,
                                              global_keys))
        return h + self.dropout(self.ffn(self.norm_ffn(h)))

    def _global(self, h: Tensor, batch: OptTensor,
                global_keys: OptTensor) -> Tensor:
        if global_keys is None:
            return self.global_attention.forward_point_sets(h, batch)
        if batch is None:
            batch = h.new_zeros(h.size(0), dtype=torch.long)
        queries, query_mask = to_dense_batch(h, batch)  # [B, L, C]
        keys, key_mask = to_dense_batch(h[global_keys], batch[global_keys],
                                        batch_size=queries.size(0))
        out, _ = self.global_attention(queries, keys, keys,
                                       key_padding_mask=~key_mask,
                                       need_weights=False)
        return out[query_mask]


class MetricMeshFormer(torch.nn.Module):
    r"""``Linear`` :math:`\to` ``num_layers`` :class:`MetricMeshFormerBlock`
    :math:`\to` ``LayerNorm`` :math:`\to` ``Linear``: per-vertex class logits.

    Heat-kernel logits :math:`-\|\phi(h_i) - \phi(h_j)\|^2 / t` of
    layer-normalised features have squared distances of order :math:`2D` for
    :math:`D` = ``channels / heads`` dimensions per head, so :math:`t` starts
    at ``time_scale`` (default :math:`2D`, logits of order one) and is learned.

    Args:
        in_channels (int): Input features per vertex.
        hidden_channels (int): Width. (default: :obj:`128`)
        out_channels (int): Classes.
        num_layers (int): Blocks. (default: :obj:`4`)
        heads (int): Attention heads. (default: :obj:`4`)
        time_scale (float, optional): Initial :math:`t`.
        learn_time_scale (bool): Learn :math:`t`. (default: :obj:`True`)
        dropout (float): Dropout on the residual branches.
        global_attention (bool): Add the global step. (default: :obj:`True`)
        metric (str): The pseudo-metric of both attentions.
            (default: :obj:`'metric'`)
        global_stride (int): Global attention attends to one in every
            ``global_stride`` vertices of each mesh, chosen by
            :func:`~pyg_metric_attn.utils.point_sets.farthest_point_sampling`
            of the positions (so the choice does not depend on the vertex
            numbering); :meth:`forward` then needs ``pos``. (default:
            :obj:`1`: all vertices)
        diffusion (bool): Start every block with a learned-time
            :class:`HeatDiffusion`; :meth:`forward` then needs the meshes'
            ``evecs``, ``evals`` and ``mass``. (default: :obj:`False`)
        gradients (bool): Add spatial gradient features of the diffused
            channels (needs ``diffusion``); :meth:`forward` then needs the
            meshes' ``grad_index`` and ``grad_weight``. (default: :obj:`False`)
    """
    def __init__(self, in_channels: int, hidden_channels: int = 128,
                 out_channels: int = 8, num_layers: int = 4, heads: int = 4,
                 time_scale: float | None = None, learn_time_scale: bool = True,
                 dropout: float = 0.0, global_attention: bool = True,
                 metric: str = 'metric', global_stride: int = 1,
                 diffusion: bool = False, gradients: bool = False):
        super().__init__()
        if global_stride < 1:
            raise ValueError(f"'global_stride' must be positive, got "
                             f"{global_stride}")
        self.global_stride = global_stride if global_attention else 1
        if time_scale is None:
            time_scale = 2.0 * hidden_channels / heads
        self.lin_in = Linear(in_channels, hidden_channels)
        self.blocks = torch.nn.ModuleList([
            MetricMeshFormerBlock(hidden_channels, heads, time_scale,
                                  learn_time_scale, dropout, global_attention,
                                  metric, diffusion, gradients)
            for _ in range(num_layers)
        ])
        self.norm_out = LayerNorm(hidden_channels)
        self.lin_out = Linear(hidden_channels, out_channels)

    def forward(self, x: Tensor, edge_index: Adj, batch: OptTensor = None,
                evecs: OptTensor = None, evals: OptTensor = None,
                mass: OptTensor = None, grad_index: OptTensor = None,
                grad_weight: OptTensor = None, pos: OptTensor = None) -> Tensor:
        """``pos``: vertex positions ``[N, 3]``, needed with
        ``global_stride > 1``."""
        spectrum = None  # prepared once, shared by every block's diffusion
        if evecs is not None and evals is not None and mass is not None:
            spectrum = MeshSpectrum.from_batch(evecs, evals, mass, batch)
        gradient = None  # checked once, shared by every block
        if grad_index is not None and grad_weight is not None:
            gradient = TangentGradient.from_batch(grad_index, grad_weight,
                                                  x.size(0))
        global_keys = None  # sampled once, shared by every block
        if self.global_stride > 1:
            if pos is None:
                raise ValueError(f"'global_stride={self.global_stride}' picks "
                                 f"the attended vertices from their positions: "
                                 f"pass 'pos'")
            global_keys = farthest_point_sampling(pos, batch, self.global_stride)
        h = self.lin_in(x)
        for block in self.blocks:
            h = block(h, edge_index, batch, spectrum, gradient, global_keys)
        return self.lin_out(self.norm_out(h))
