r"""The launcher of the exact dense-attention kernels (:mod:`.exact_kernels`),
the CUDA implementation of ``pyg_metric_attn::exact_attention_where``
(:mod:`pyg_metric_attn.nn.exact_attention`, which holds the operators and
their autograd).

The inputs are brought to two leading dimensions without copying (a
broadcast dimension keeps stride 0; more than two leading dimensions are
flattened, which copies only where their strides do not merge). Launch
parameters: ``BLOCK_M = 16`` queries per row program, ``BLOCK_N = 8`` keys
per column program and per inner step, ``BLOCK_D``, ``BLOCK_C`` the metric
and value widths rounded up to a power of two (>= 16; masked), 4 warps:
float64 products are broadcast ``[BLOCK_M, BLOCK_N, BLOCK_C]`` tiles (no
float64 ``tl.dot``), so the blocks stay small; untuned on a GPU. Grid
``(ceil(L / block), N1, N0)``: each leading dimension holds at most 65535
softmaxes on CUDA. Every launch reads nothing back to the host. CPU tensors
run in Triton's interpreter (``TRITON_INTERPRET=1``), for tests.
"""
from __future__ import annotations

import torch
from torch import Tensor

BLOCK_M = 16  # queries per program (forward, backward rows)
BLOCK_N = 8  # keys per program (backward columns) and per inner step
NUM_WARPS = 4

#: The jit kernels, imported on first use (the import reads TRITON_INTERPRET).
_kernels: dict | None = None


def kernels() -> dict:
    global _kernels
    if _kernels is None:
        try:
            from pyg_metric_attn.nn.triton import exact_kernels
        except ImportError as error:  # pragma: no cover - triton is missing
            raise ImportError(
                "The exact correction of dense attention on a GPU needs "
                "Triton, which is not installed; install it with `pip install "
                "pyg-metric-attn[gpu]`, or use precision='fast'.") from error
        _kernels = {'exact_forward': exact_kernels.exact_forward_kernel,
                    'exact_backward_rows': exact_kernels.exact_backward_rows_kernel,
                    'exact_backward_columns':
                        exact_kernels.exact_backward_columns_kernel}
    return _kernels


def _width(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


def _two_leading(x: Tensor, batch: torch.Size, *tail: int) -> Tensor:
    """``x`` expanded to ``[*batch, *tail]`` with exactly two leading
    dimensions."""
    x = x.expand((*batch, *tail))
    if len(batch) > 2:
        return x.reshape(-1, batch[-1], *tail)
    return x[(None,) * (2 - len(batch))]


def _strides(x: Tensor) -> tuple[int, ...]:
    return tuple(x.stride())


class _Launch:
    """The inputs of one call with two leading dimensions, and what the
    kernels are specialised on."""
    def __init__(self, needs_exact: Tensor, query: Tensor, key: Tensor,
                 value: Tensor, time_scale: Tensor, attn_mask: Tensor | None,
                 seed: Tensor | None, metric: str, is_causal: bool,
                 dropout_p: float):
        self.batch = needs_exact.shape
        self.num_queries, self.dim = query.shape[-2:]
        self.num_keys, self.channels = value.shape[-2:]
        lq, lk = self.num_queries, self.num_keys
        self.flags = _two_leading(needs_exact, self.batch).view(torch.uint8)
        self.time_scale = _two_leading(time_scale, self.batch)
        self.query = _two_leading(query, self.batch, lq, self.dim)
        self.key = _two_leading(key, self.batch, lk, self.dim)
        self.value = _two_leading(value, self.batch, lk, self.channels)
        self.mask = attn_mask
        if attn_mask is not None:
            self.mask = _two_leading(attn_mask, self.batch, lq, lk)
            if attn_mask.dtype == torch.bool:
                self.mask = self.mask.view(torch.uint8)
        self.seed = seed
        self.n0, self.n1 = self.flags.shape
        self.dropout_p = dropout_p
        self.flags_kw = dict(
            DOT=metric == 'dot', HAS_MASK=attn_mask is not None,
            MASK_BOOL=attn_mask is not None and attn_mask.dtype == torch.bool,
            CAUSAL=is_causal, DROPOUT=dropout_p > 0)

    def pointers(self) -> tuple:
        """Flags, time scale, query, key, value, mask, seed (absent ones
        point at the flags; the kernels do not read them)."""
        return (self.flags, self.time_scale, self.query, self.key, self.value,
                self.flags if self.mask is None else self.mask,
                self.flags if self.seed is None else self.seed)

    def input_strides(self) -> tuple[int, ...]:
        mask_strides = (0, 0, 0, 0) if self.mask is None else _strides(self.mask)
        return (*_strides(self.flags), *_strides(self.time_scale),
                *_strides(self.query), *_strides(self.key),
                *_strides(self.value), *mask_strides)

    def grid(self, length: int, block: int) -> tuple[int, int, int]:
        return (-(-length // block), self.n1, self.n0)

    def blocks(self) -> dict:
        return dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_C=_width(self.channels),
                    num_warps=NUM_WARPS)

    def sizes(self) -> tuple[int, ...]:
        return (self.num_queries, self.num_keys, self.dim, self.channels, self.n1)


def exact_forward(needs_exact: Tensor, query: Tensor, key: Tensor, value: Tensor,
                  time_scale: Tensor, attn_mask: Tensor | None,
                  seed: Tensor | None, fused_out: Tensor, metric: str,
                  is_causal: bool, dropout_p: float) -> tuple[Tensor, Tensor]:
    """``(out, stats)`` (see
    :func:`~pyg_metric_attn.nn.exact_attention.exact_where`)."""
    launch = _Launch(needs_exact, query, key, value, time_scale, attn_mask, seed,
                     metric, is_causal, dropout_p)
    out = fused_out.clone(memory_format=torch.contiguous_format)
    stats = torch.empty(*launch.batch, launch.num_queries, 2,
                        dtype=torch.float64, device=out.device)
    if out.numel() == 0 or launch.num_queries == 0:
        return out, stats
    out4 = _two_leading(out, launch.batch, launch.num_queries, launch.channels)
    kernels()['exact_forward'][launch.grid(launch.num_queries, BLOCK_M)](
        *launch.pointers(), out4, stats, *launch.sizes(), *launch.input_strides(),
        *_strides(out4), dropout_p, **launch.flags_kw, **launch.blocks())
    return out, stats


def exact_backward(grad_out: Tensor, needs_exact: Tensor, query: Tensor,
                   key: Tensor, value: Tensor, time_scale: Tensor,
                   attn_mask: Tensor | None, seed: Tensor | None, stats: Tensor,
                   metric: str, is_causal: bool, dropout_p: float,
                   need: list[bool]) -> tuple[Tensor, ...]:
    """``(dq, dk, dv, dt, dmask)`` (see
    :func:`~pyg_metric_attn.nn.exact_attention.exact_where_backward`)."""
    launch = _Launch(needs_exact, query, key, value, time_scale, attn_mask, seed,
                     metric, is_causal, dropout_p)
    need_q, need_k, need_v, need_t, need_mask = need
    batch, lq, lk = launch.batch, launch.num_queries, launch.num_keys
    device = grad_out.device

    def zeros(shape: tuple, like: Tensor | None, wanted: bool,
              dtype: torch.dtype | None = None) -> Tensor:
        if not wanted:
            return query.new_empty(0)
        return torch.zeros(shape, dtype=dtype or like.dtype, device=device)

    n_blocks = -(-lq // BLOCK_M)
    dq = zeros((*batch, lq, launch.dim), query, need_q)
    dk = zeros((*batch, lk, launch.dim), key, need_k)
    dv = zeros((*batch, lk, launch.channels), value, need_v)
    dt = zeros((*batch, n_blocks), None, need_t, torch.float64)
    dmask = zeros((*batch, lq, lk), None, need_mask, torch.float64)
    if grad_out.numel() and lq and lk and any(need):
        delta = torch.empty(*batch, lq, dtype=torch.float64, device=device)
        dout = _two_leading(grad_out, batch, lq, launch.channels)
        dq4 = _two_leading(dq, batch, lq, launch.dim) if need_q else dout
        kern = kernels()
        blocks = dict(**launch.blocks(), BLOCK_D=_width(launch.dim))
        kern['exact_backward_rows'][launch.grid(lq, BLOCK_M)](
            *launch.pointers(), dout, stats, delta, dq4,
            dmask if need_mask else delta, dt if need_t else delta,
            *launch.sizes(), n_blocks, *launch.input_strides(), *_strides(dout),
            *_strides(dq4), dropout_p, NEED_DQ=need_q, NEED_DT=need_t,
            NEED_DMASK=need_mask, **launch.flags_kw, **blocks)
        if need_k or need_v:
            dk4 = _two_leading(dk, batch, lk, launch.dim) if need_k else dout
            dv4 = _two_leading(dv, batch, lk, launch.channels) if need_v else dout
            kern['exact_backward_columns'][launch.grid(lk, BLOCK_N)](
                *launch.pointers(), dout, stats, delta, dk4, dv4,
                *launch.sizes(), *launch.input_strides(), *_strides(dout),
                *_strides(dk4), *_strides(dv4), dropout_p, NEED_DK=need_k,
                NEED_DV=need_v, **launch.flags_kw, **blocks)
    grads = []
    for grad, x, wanted in zip((dq, dk, dv, dt.sum(-1) if need_t else dt, dmask),
                               (query, key, value, time_scale, attn_mask), need,
                               strict=True):
        grads.append(grad.sum_to_size(x.shape).to(x.dtype) if wanted else grad)
    return tuple(grads)
