r"""An encoder-decoder Transformer (Vaswani et al. 2017) whose encoder
self-, decoder self- (causal) and cross-attention are
:class:`~pyg_metric_attn.nn.MetricMultiheadAttention` (``'metric'``,
``'l2'`` or ``'dot'``), as in the paper's Multi30k experiment."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Dropout, Embedding, LayerNorm, Linear, ModuleList
from torch_geometric.nn.inits import reset

from pyg_metric_attn.nn.dense.multihead import MetricMultiheadAttention
from pyg_metric_attn.nn.pseudo_metric import check_metric


def sinusoidal_positions(length: int, channels: int,
                         device: torch.device | None = None) -> Tensor:
    r"""``[length, channels]`` sinusoidal position codes:
    :math:`PE_{p, 2i} = \sin(p / 10000^{2i/d})`,
    :math:`PE_{p, 2i+1} = \cos(p / 10000^{2i/d})`."""
    position = torch.arange(length, dtype=torch.float, device=device)
    frequency = torch.exp(torch.arange(0, channels, 2, dtype=torch.float,
                                       device=device)
                          * (-math.log(10000.0) / channels))
    angles = position[:, None] * frequency[None, :]
    codes = torch.zeros(length, channels, device=device)
    codes[:, 0::2] = torch.sin(angles)
    codes[:, 1::2] = torch.cos(angles[:, :channels // 2])
    return codes


class _Sublayers(torch.nn.Module):
    """Residual wrapper shared by both layer types: ``x + f(x)`` with the
    layer norm before ``f`` (pre-norm) or after the sum (post-norm)."""
    def __init__(self, d_model: int, num_sublayers: int, dropout: float,
                 norm_first: bool):
        super().__init__()
        self.norm_first = norm_first
        self.norms = ModuleList([LayerNorm(d_model) for _ in range(num_sublayers)])
        self.dropout = Dropout(dropout)

    def reset_parameters(self) -> None:
        for child in self.children():
            reset(child)

    def residual(self, index: int, x: Tensor, sublayer) -> Tensor:
        norm = self.norms[index]
        if self.norm_first:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))


class MetricTransformerEncoderLayer(_Sublayers):
    r"""Self-attention and a feed-forward block, each with a residual
    connection and layer norm (arguments as
    :class:`torch.nn.TransformerEncoderLayer`, ``batch_first`` always).

    Args:
        d_model (int): Model width.
        num_heads (int): Attention heads.
        dim_feedforward (int): Hidden width of the feed-forward block.
        dropout (float): Dropout on sublayer outputs, attention weights and
            the feed-forward hidden layer.
        attention (str): ``'metric'``, ``'l2'`` or ``'dot'``.
        norm_first (bool): Pre-norm instead of post-norm.
        **attention_kwargs: Further arguments of
            :class:`~pyg_metric_attn.nn.MetricMultiheadAttention`
            (``time_scale``, ``learn_time_scale``, ``mlp_channels``).
    """
    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, attention: str = 'metric',
                 norm_first: bool = False, **attention_kwargs):
        super().__init__(d_model, 2, dropout, norm_first)
        self.self_attn = MetricMultiheadAttention(
            d_model, num_heads, metric=attention, dropout=dropout,
            **attention_kwargs)
        self.feed_forward = _feed_forward(d_model, dim_feedforward, dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``x`` ``[B, S, E]``; ``padding_mask`` ``[B, S]``, True = padding."""
        x = self.residual(0, x, lambda h: self.self_attn(
            h, h, h, key_padding_mask=padding_mask, need_weights=False)[0])
        return self.residual(1, x, self.feed_forward)


class MetricTransformerDecoderLayer(_Sublayers):
    r"""Causal self-attention, cross-attention to the encoder output and a
    feed-forward block (arguments as :class:`MetricTransformerEncoderLayer`)."""
    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, attention: str = 'metric',
                 norm_first: bool = False, **attention_kwargs):
        super().__init__(d_model, 3, dropout, norm_first)
        self.self_attn = MetricMultiheadAttention(
            d_model, num_heads, metric=attention, dropout=dropout,
            **attention_kwargs)
        self.cross_attn = MetricMultiheadAttention(
            d_model, num_heads, metric=attention, dropout=dropout,
            **attention_kwargs)
        self.feed_forward = _feed_forward(d_model, dim_feedforward, dropout)

    def forward(self, x: Tensor, memory: Tensor,
                memory_padding_mask: Tensor | None = None,
                prefix: Tensor | None = None) -> Tensor:
        """``x`` ``[B, T, E]`` (position ``i`` sees positions ``<= i``),
        ``memory`` ``[B, S, E]``, ``memory_padding_mask`` ``[B, S]``.

        For incremental decoding, ``prefix`` ``[B, P, E]`` holds this
        layer's inputs at all positions so far, the last ``T`` of which are
        ``x``; ``x`` then attends to all of ``prefix`` (no causal mask)."""
        x = self.residual(0, x, lambda h: self._self_attend(h, prefix))
        x = self.residual(1, x, lambda h: self.cross_attn(
            h, memory, memory, key_padding_mask=memory_padding_mask,
            need_weights=False)[0])
        return self.residual(2, x, self.feed_forward)

    def _self_attend(self, h: Tensor, prefix: Tensor | None) -> Tensor:
        if prefix is None:
            return self.self_attn(h, h, h, need_weights=False, is_causal=True)[0]
        context = self.norms[0](prefix) if self.norm_first else prefix
        return self.self_attn(h, context, context, need_weights=False)[0]


def _feed_forward(d_model: int, hidden: int, dropout: float) -> torch.nn.Module:
    return torch.nn.Sequential(Linear(d_model, hidden), torch.nn.ReLU(),
                               Dropout(dropout), Linear(hidden, d_model))


class MetricTransformer(torch.nn.Module):
    r"""Encoder-decoder Transformer for sequence-to-sequence tasks with
    metric-, L2- or dot-product attention in every attention block.

    Tokens are embedded (scaled by :math:`\sqrt{d}`), sinusoidal positions
    are added, and the decoder's last states are mapped to vocabulary
    logits. Index ``pad_index`` marks padding in both sequences.

    Args:
        src_vocab_size (int): Source vocabulary size.
        tgt_vocab_size (int): Target vocabulary size.
        d_model (int, optional): Model width. (default: :obj:`512`)
        num_heads (int, optional): Attention heads. (default: :obj:`8`)
        num_encoder_layers (int, optional): (default: :obj:`6`)
        num_decoder_layers (int, optional): (default: :obj:`6`)
        dim_feedforward (int, optional): (default: :obj:`2048`)
        dropout (float, optional): (default: :obj:`0.1`)
        attention (str, optional): ``'metric'``, ``'l2'`` or ``'dot'``.
            (default: :obj:`'metric'`)
        norm_first (bool, optional): Pre-norm layers (with a final layer norm
            after each stack) instead of post-norm. (default: :obj:`False`)
        share_embeddings (bool, optional): One embedding matrix for source,
            target and the output layer (needs a joint vocabulary).
            (default: :obj:`False`)
        pad_index (int, optional): The padding token. (default: :obj:`0`)
        time_scale (float or str, optional): The attention time scale
            :math:`t`, or ``'matched'``: :math:`t = 2\sqrt{D}` for the
            attention's metric width per head :math:`D` (``d_model /
            num_heads - 1``, see
            :class:`~pyg_metric_attn.nn.MetricMultiheadAttention`;
            :math:`1` for ``'dot'``), the
            logit scale of scaled dot-product attention. The default is the
            paper's :math:`t = 1`, under which each token attends almost only
            to itself at initialisation for :math:`D \gtrsim 8` (see
            :mod:`~pyg_metric_attn.nn.time_scale`). (default: :obj:`1.0`)
        learn_time_scale (bool, optional): Learn :math:`t` per attention
            block. (default: :obj:`False`)
        mlp_channels (int, optional): Hidden width :math:`d_{mlp}` of the
            metric map :math:`\phi`. (default: ``d_model``)
    """
    def __init__(self, src_vocab_size: int, tgt_vocab_size: int,
                 d_model: int = 512, num_heads: int = 8,
                 num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1,
                 attention: str = 'metric', norm_first: bool = False,
                 share_embeddings: bool = False, pad_index: int = 0,
                 time_scale: float | str = 1.0, learn_time_scale: bool = False,
                 mlp_channels: int | None = None):
        super().__init__()
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"'share_embeddings' needs one vocabulary, got sizes "
                             f"{src_vocab_size} and {tgt_vocab_size}")
        if d_model % num_heads:
            raise ValueError(f"'d_model' ({d_model}) must be divisible by "
                             f"'num_heads' ({num_heads})")
        self.d_model = d_model
        self.attention = check_metric(attention)
        self.pad_index = pad_index
        self.share_embeddings = share_embeddings

        self.src_embedding = Embedding(src_vocab_size, d_model, padding_idx=pad_index)
        self.tgt_embedding = (self.src_embedding if share_embeddings else
                              Embedding(tgt_vocab_size, d_model,
                                        padding_idx=pad_index))
        self.dropout = Dropout(dropout)
        layer_kwargs = dict(dim_feedforward=dim_feedforward, dropout=dropout,
                            attention=attention, norm_first=norm_first,
                            time_scale=time_scale,
                            learn_time_scale=learn_time_scale,
                            mlp_channels=mlp_channels)
        self.encoder_layers = ModuleList([
            MetricTransformerEncoderLayer(d_model, num_heads, **layer_kwargs)
            for _ in range(num_encoder_layers)])
        self.decoder_layers = ModuleList([
            MetricTransformerDecoderLayer(d_model, num_heads, **layer_kwargs)
            for _ in range(num_decoder_layers)])
        self.encoder_norm = LayerNorm(d_model) if norm_first else None
        self.decoder_norm = LayerNorm(d_model) if norm_first else None
        self.generator = Linear(d_model, tgt_vocab_size)
        self._reset_embeddings()  # the layers initialised themselves

    def reset_parameters(self) -> None:
        for layer in (*self.encoder_layers, *self.decoder_layers):
            layer.reset_parameters()
        for norm in (self.encoder_norm, self.decoder_norm):
            if norm is not None:
                norm.reset_parameters()
        self._reset_embeddings()

    def _reset_embeddings(self) -> None:
        r"""Embeddings :math:`\mathcal{N}(0, 1/d)` (padding row zero) and the
        output layer (tied to them, or Xavier-uniform)."""
        for embedding in dict.fromkeys((self.src_embedding, self.tgt_embedding)):
            torch.nn.init.normal_(embedding.weight, std=self.d_model**-0.5)
            with torch.no_grad():
                embedding.weight[self.pad_index].zero_()
        if self.share_embeddings:
            self.generator.weight = self.src_embedding.weight
        else:
            torch.nn.init.xavier_uniform_(self.generator.weight)
        torch.nn.init.zeros_(self.generator.bias)

    def _embed(self, embedding: Embedding, tokens: Tensor, start: int = 0) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.d_model)
        positions = sinusoidal_positions(start + tokens.size(1), self.d_model,
                                         x.device)[start:]
        return self.dropout(x + positions)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encode ``src`` ``[B, S]``: returns ``(memory [B, S, E],
        padding_mask [B, S])``."""
        padding_mask = src == self.pad_index
        x = self._embed(self.src_embedding, src)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, padding_mask

    def decoder_states(self, tgt: Tensor, memory: Tensor,
                       memory_padding_mask: Tensor | None = None) -> Tensor:
        """Last decoder states ``[B, T, E]`` for the target prefix ``tgt``
        ``[B, T]`` (position ``i`` depends on ``tgt[:, :i + 1]`` only)."""
        x = self._embed(self.tgt_embedding, tgt)
        for layer in self.decoder_layers:
            x = layer(x, memory, memory_padding_mask)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x

    def decoder_step(self, token: Tensor, memory: Tensor,
                     memory_padding_mask: Tensor | None = None,
                     cache: list[Tensor] | None = None,
                     ) -> tuple[Tensor, list[Tensor]]:
        """One step of incremental decoding: the last decoder state ``[B, E]``
        after the newest target token ``token`` ``[B]``, and the updated
        ``cache`` (each decoder layer's inputs at all positions so far;
        reorder its batch rows together with the hypotheses). Gives the same
        states as :meth:`decoder_states` on the whole prefix."""
        start = 0 if cache is None else cache[0].size(1)
        x = self._embed(self.tgt_embedding, token[:, None], start)
        new_cache = []
        for i, layer in enumerate(self.decoder_layers):
            prefix = x if cache is None else torch.cat([cache[i], x], dim=1)
            new_cache.append(prefix)
            x = layer(x, memory, memory_padding_mask, prefix=prefix)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x[:, 0], new_cache

    def decode(self, tgt: Tensor, memory: Tensor,
               memory_padding_mask: Tensor | None = None) -> Tensor:
        """Next-token logits ``[B, T, V]`` for the target prefix ``tgt``."""
        return self.generator(self.decoder_states(tgt, memory,
                                                  memory_padding_mask))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced logits ``[B, T, V]``: ``tgt`` is the target with
        the begin-of-sequence token and without the last token."""
        memory, padding_mask = self.encode(src)
        return self.decode(tgt, memory, padding_mask)

    def loss(self, src: Tensor, tgt: Tensor, label_smoothing: float = 0.0,
             reduction: str = 'mean') -> Tensor:
        r"""Cross entropy of predicting ``tgt[:, 1:]`` from ``tgt[:, :-1]``
        (``tgt`` = BOS, tokens, EOS, padding); padding is ignored."""
        logits = self(src, tgt[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(),
                               ignore_index=self.pad_index,
                               label_smoothing=label_smoothing,
                               reduction=reduction)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(attention={self.attention!r}, '
                f'd_model={self.d_model}, '
                f'encoder_layers={len(self.encoder_layers)}, '
                f'decoder_layers={len(self.decoder_layers)})')
