r"""Dense multi-head metric-attention with :class:`torch.nn.MultiheadAttention`'s
call and mask conventions."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import Linear
from torch_geometric.utils import to_dense_batch

from pyg_metric_attn.nn.functional import dense_metric_attention, merge_masks
from pyg_metric_attn.nn.logits import check_precision
from pyg_metric_attn.nn.normalization import check_normalization
from pyg_metric_attn.nn.pseudo_metric import check_metric, embed_pair, metric_maps
from pyg_metric_attn.nn.time_scale import TimeScale, resolve_time_scale
from pyg_metric_attn.utils.point_sets import check_batch, point_set_mask


class MetricMultiheadAttention(torch.nn.Module):
    r"""Multi-head attention whose logits come from a learned pseudo-metric.

    Per head :math:`h`, with :math:`\phi(x)_h` of the metric width :math:`D`
    (``metric_channels``) and values of the head width
    :math:`\text{embed\_dim} / H`:

    * ``'metric'``: :math:`s_{ij} = -\|\phi(x_i)_h - \phi(y_j)_h\|^2 / t`
      with :math:`\phi(u) = P u + W_2 \tanh(W_1 u + b_1) + b_2` shared by
      queries and keys (Ruan & Zhang's metric-attention; :math:`P` the
      identity where the metric space is as wide as the input, else
      learned),
    * ``'l2'``: the same with a tied linear map :math:`\phi(u) = W u`
      (L2 self-attention, :math:`W_Q = W_K`),
    * ``'dot'``: :math:`s_{ij} = (W_q x_i)_h^\top (W_k y_j)_h / (\sqrt{D}\, t)`.

    Values and the output use the usual projections :math:`W_v, W_o`. All
    three run through :func:`~torch.nn.functional.scaled_dot_product_attention`
    (see :func:`~pyg_metric_attn.nn.functional.dense_metric_attention`), so no
    ``L x S`` score matrix is stored unless ``need_weights=True``.

    The metric width. The distance logits run as dot-product attention on
    the augmented points :math:`[\phi(x)_h, -\tfrac12]` and
    :math:`[\phi(y)_h, \|\phi(y)_h\|^2]`, one coordinate wider than the
    metric space. So ``'metric'`` and ``'l2'`` default to a metric space one
    coordinate narrower than the head (:math:`D = \text{embed\_dim} / H -
    1`, e.g. 63 for heads of 64): the augmented width is then the head width,
    a native head size of the flash kernels, where :math:`D` equal to the head
    width (the width before this default; pass ``metric_channels=embed_dim //
    num_heads`` to keep it) makes 65, padded to the next kernel size (128 in
    cuDNN's flash attention). With a metric space narrower than the input,
    :math:`\phi`'s skip connection is a learned linear map (see
    :class:`~pyg_metric_attn.nn.pseudo_metric.ResidualTanhMLP`).

    The similarities :math:`K_{ij} = \exp(s_{ij})` are normalised by one of
    the paper's four normalisations (Definitions 7-10,
    :mod:`~pyg_metric_attn.nn.normalization`), masked entries left out:

    * ``'row'``: :math:`\alpha_{ij} = K_{ij} / \sum_{k} K_{ik}` (softmax over
      the keys; SDPA),
    * ``'column'``: :math:`\alpha_{ij} = K_{ij} / \sum_{k} K_{kj}` (over the
      queries),
    * ``'sinkhorn'``: ``sinkhorn_iterations`` times a column then a row
      normalisation (Sinkformers): rows sum to 1, columns approach 1,
    * ``'global'``: :math:`\alpha_{ij} = K_{ij} / \sum_{k, l} K_{kl}` per
      batch element and head.

    All but ``'row'`` run on an explicit ``[B, H, L, S]`` score matrix
    (:math:`O(L S)` memory).

    Args:
        embed_dim (int): Model width (divisible by ``num_heads``).
        num_heads (int): Number of heads.
        metric (str, optional): ``'metric'``, ``'l2'`` or ``'dot'``.
            (default: :obj:`'metric'`)
        dropout (float, optional): Dropout on the attention weights.
        bias (bool, optional): Biases in the value, output (and ``'dot'``
            query/key) projections. (default: :obj:`True`)
        kdim (int, optional): Key width (default ``embed_dim``). For the tied
            maps a different width gives keys their own map.
        vdim (int, optional): Value width (default ``embed_dim``).
        batch_first (bool, optional): Inputs are ``[batch, seq, feature]``.
            (default: :obj:`True`)
        mlp_channels (int, optional): Hidden width :math:`d_{mlp}` of
            :math:`\phi`. (default: ``embed_dim``)
        metric_channels (int, optional): The metric (query/key) width
            :math:`D` per head. (default: ``embed_dim // num_heads - 1`` for
            ``'metric'`` and ``'l2'`` (see above; ``1`` for heads of width
            1), ``embed_dim // num_heads`` for ``'dot'``)
        time_scale (float or str, optional): The time scale :math:`t`, or
            ``'matched'``: :math:`t = 2\sqrt{D}` (:math:`1` for ``'dot'``),
            the logit scale of scaled dot-product attention. The default is
            the paper's :math:`t = 1`, which saturates from :math:`D \approx
            8` on (see :mod:`~pyg_metric_attn.nn.time_scale`).
            (default: :obj:`1.0`)
        learn_time_scale (bool, optional): Learn :math:`t` (log-parametrised).
            (default: :obj:`False`)
        normalization (str, optional): ``'row'``, ``'column'``,
            ``'sinkhorn'`` or ``'global'`` (see above). (default: :obj:`'row'`)
        sinkhorn_iterations (int, optional): Column-then-row steps of
            ``'sinkhorn'``. (default: :obj:`3`)
        precision (str, optional): ``'checked'`` (exact float64 attention
            in each softmax whose fused logits would round too much,
            decided on the device) or ``'fast'`` (no check: fewer ops per
            call); neither synchronises with the host, and
            ``torch.compile(fullgraph=True)`` compiles the layer with
            both; see :mod:`~pyg_metric_attn.nn.logits`.
            (default: :obj:`'checked'`)
    """
    def __init__(self, embed_dim: int, num_heads: int, metric: str = 'metric',
                 dropout: float = 0.0, bias: bool = True, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = True,
                 mlp_channels: int | None = None, time_scale: float | str = 1.0,
                 learn_time_scale: bool = False, normalization: str = 'row',
                 sinkhorn_iterations: int = 3,
                 metric_channels: int | None = None,
                 precision: str = 'checked'):
        super().__init__()
        if embed_dim < 1 or num_heads < 1:
            raise ValueError(f"'embed_dim' and 'num_heads' must be positive, got "
                             f"embed_dim={embed_dim}, num_heads={num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"'embed_dim' ({embed_dim}) must be divisible by "
                             f"'num_heads' ({num_heads})")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.metric = check_metric(metric)
        if metric_channels is None:
            narrower = self.metric != 'dot' and self.head_dim > 1
            metric_channels = self.head_dim - 1 if narrower else self.head_dim
        if metric_channels < 1:
            raise ValueError(f"'metric_channels' must be positive, got "
                             f"{metric_channels}")
        self.metric_channels = metric_channels
        self.precision = check_precision(precision)
        self.normalization = check_normalization(normalization,
                                                 sinkhorn_iterations)
        self.sinkhorn_iterations = sinkhorn_iterations
        self.dropout = dropout
        self.kdim = kdim or embed_dim
        self.vdim = vdim or embed_dim
        self.batch_first = batch_first
        self.mlp_channels = mlp_channels or embed_dim
        self.time = TimeScale(resolve_time_scale(
            time_scale, self.metric, self.metric_channels), learn_time_scale)

        # key_map None: keys share the tied query map.
        self.query_map, self.key_map = metric_maps(
            self.metric, embed_dim, self.kdim, num_heads * metric_channels,
            self.mlp_channels, bias=bias, separate=self.kdim != embed_dim)
        self.v_proj = Linear(self.vdim, embed_dim, bias=bias)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in (self.query_map, self.key_map):
            if module is not None:
                module.reset_parameters()
        for projection in (self.v_proj, self.out_proj):
            torch.nn.init.xavier_uniform_(projection.weight)
            if projection.bias is not None:
                torch.nn.init.zeros_(projection.bias)
        self.time.reset_parameters()

    @property
    def time_scale(self) -> Tensor | float:
        """The time scale :math:`t` (a tensor when it is learned)."""
        return self.time()

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        r"""Attend from ``query`` to ``key``/``value``.

        Masks follow :class:`torch.nn.MultiheadAttention`: a boolean
        ``key_padding_mask`` ``[B, S]`` or ``attn_mask`` ``[L, S]`` /
        ``[B * H, L, S]`` marks with :obj:`True` what may *not* be attended to;
        float masks are added to the logits. ``is_causal=True`` without an
        ``attn_mask`` applies the causal mask (query :math:`i` sees keys
        :math:`j \le i`); with one, the given mask is used as the causal mask.

        Returns:
            ``(output, weights)``: output ``[B, L, E]`` (``[L, B, E]`` unless
            ``batch_first``), weights ``[B, L, S]`` averaged over heads (or
            ``[B, H, L, S]``) when ``need_weights``, else :obj:`None`.
        """
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        self._check(query, key, value)
        q, k = self._embed(query, key)
        mask = self._sdpa_mask(key_padding_mask, attn_mask, query.size(0),
                               query.size(1), key.size(1), q.dtype)
        out, weights = self._attend(q, k, value, mask,
                                    is_causal and attn_mask is None,
                                    need_weights)
        if not self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def forward_point_sets(self, x: Tensor, batch: Tensor | None = None) -> Tensor:
        """Self-attention among all points of each set (e.g. all nodes of each
        graph of a PyG mini-batch), ``[N, E] -> [N, E]``; ``batch`` is the
        sorted set index of each point (checked outside
        :func:`torch.compile`). Padding is left out of every normalisation."""
        if batch is not None and not torch.compiler.is_compiling():
            check_batch(batch, x.size(0))
        dense, mask = to_dense_batch(x, batch)  # [B, L, E], [B, L]
        q, k = self._embed(dense, dense)
        out, _ = self._attend(q, k, dense,
                              point_set_mask(mask, self.normalization),
                              is_causal=False, need_weights=False)
        return out[mask]

    def _attend(self, q: Tensor, k: Tensor, value: Tensor,
                mask: Tensor | None, is_causal: bool,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Batch-first attention of the embedded ``q``, ``k`` ``[B, H, L, D]``
        with an SDPA ``mask``: output ``[B, L, E]`` and the per-head weights
        ``[B, H, L, S]`` (or :obj:`None`)."""
        v = self._split_heads(self.v_proj(value))
        out, weights = dense_metric_attention(
            q, k, v, self.metric, self.time_scale, attn_mask=mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights, normalization=self.normalization,
            sinkhorn_iterations=self.sinkhorn_iterations,
            precision=self.precision)
        out = out.transpose(1, 2).reshape(q.size(0), q.size(2), self.embed_dim)
        return self.out_proj(out), weights

    def _check(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, tensor, width in (('query', query, self.embed_dim),
                                    ('key', key, self.kdim),
                                    ('value', value, self.vdim)):
            if tensor.dim() != 3 or tensor.size(-1) != width:
                raise ValueError(f"'{name}' must have shape [batch, length, "
                                 f"{width}], got {list(tensor.shape)}")
        if key.shape[:2] != value.shape[:2] or key.size(0) != query.size(0):
            raise ValueError(f"Batch/length mismatch: query {list(query.shape)}, "
                             f"key {list(key.shape)}, value {list(value.shape)}")

    def _split_heads(self, x: Tensor) -> Tensor:
        """``[B, L, H * K]`` -> ``[B, H, L, K]``."""
        return x.view(x.size(0), x.size(1), self.num_heads, -1).transpose(1, 2)

    def _embed(self, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys in the metric space, ``[B, H, L, D]``."""
        q, k = embed_pair(self.query_map, self.key_map, query, key)
        return self._split_heads(q), self._split_heads(k)

    def _sdpa_mask(self, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
                   batch: int, num_queries: int, num_keys: int,
                   dtype: torch.dtype) -> Tensor | None:
        """Both torch-MHA masks as one SDPA mask (True / 0 = may attend)."""
        masks = []
        if key_padding_mask is not None:
            if key_padding_mask.shape != (batch, num_keys):
                raise ValueError(f"'key_padding_mask' must have shape "
                                 f"[{batch}, {num_keys}], got "
                                 f"{list(key_padding_mask.shape)}")
            masks.append(key_padding_mask.view(batch, 1, 1, num_keys))
        if attn_mask is not None:
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.view(batch, self.num_heads, num_queries,
                                           num_keys)
            elif attn_mask.shape != (num_queries, num_keys):
                raise ValueError(f"'attn_mask' must have shape [{num_queries}, "
                                 f"{num_keys}] or [batch * heads, "
                                 f"{num_queries}, {num_keys}], got "
                                 f"{list(attn_mask.shape)}")
            masks.append(attn_mask)
        # torch's MHA marks what may *not* be attended to; SDPA what may.
        return merge_masks([~m if m.dtype == torch.bool else m for m in masks],
                           dtype)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.embed_dim}, '
                f'num_heads={self.num_heads}, metric={self.metric!r}'
                + (f', normalization={self.normalization!r})'
                   if self.normalization != 'row' else ')'))
