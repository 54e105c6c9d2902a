"""The GPU suite: everything the issue asks to measure on a lent GPU, in one
command that fits one 10-minute device call.

    python -m benchmarks.run --suite gpu [--device cuda] [--quick] [--tiny]
        [--budget-s 540] [--only WORD ...] [--variants NAME ...]
        [--multi30k auto|real|synthetic|off] [--out DIR] [--dry-run]

What runs, in this order (most important first, so that a run cut short by
``--budget-s`` still holds the targets):

1. ``sdpa-kernels``: one forward + backward of SDPA-dot, metric-SDPA and
   :class:`~pyg_metric_attn.MetricMultiheadAttention` (metric and dot) in
   bfloat16 under :mod:`torch.profiler`; which SDPA kernels ran (flash,
   efficient, cudnn or the math fallback). See :func:`sdpa_kernels`.
2. ``dense-kernel``: ``[8, 8, L, 64]`` bfloat16 values; SDPA-dot (q, k of
   width 64) against metric-SDPA
   (:func:`~pyg_metric_attn.nn.functional.dense_metric_attention`, q, k of
   metric width 63: SDPA on the augmented width 63 + 1 = 64, the layout of
   :class:`~pyg_metric_attn.MetricMultiheadAttention`; a metric width of 64
   would pad 65 to 72 and run cuDNN's 128-wide kernel, 2.3x SDPA-dot at
   L = 4096 on an H100, 2026-11-26).
3. ``sparse`` at the sizes most people train (issue 26): one layer
   ``64 -> 4 heads x 16`` of GATConv and MetricAttentionConv ('triton',
   'fused') on uniform graphs of the sizes of Cora (2,708 nodes / 10,556
   edges), PubMed (19,717 / 88,648) and ogbn-arxiv (169,343 / 1,166,243),
   float32, eager and (at the first two sizes) under
   ``torch.compile(mode='reduce-overhead', fullgraph=True)`` (variants
   ``*-compiled``:
   forward + backward only, three warm-up steps for the compile and the
   CUDA graph's recording; each cell counts Inductor's fallbacks from CUDA
   graphs, and its job's stderr says why).
   ``sparse`` at scale: one layer ``64 -> 4 heads x 64`` (concat; each layer's
   defaults, self-loops added by the layer) of GATConv, GATv2Conv,
   TransformerConv and MetricAttentionConv with backend 'triton', 'scatter'
   and 'fused', on uniform graphs (100k nodes / 2M edges, 1M / 20M) and
   power-law graphs of the same sizes
   (:func:`benchmarks.graphs.power_law_edge_index`), in float32 and
   bfloat16. bfloat16 *casts the model and the inputs*
   (``.to(torch.bfloat16)``), not autocast: PyG's layers run end to end in
   bfloat16 that way, while under autocast their scatter ops meet mixed
   dtypes. (MetricAttentionConv still forms its logits in float32.) At
   100k / 2M float32 the forward + backward of GATConv and metric-triton is
   also profiled: the share of the step the GPU spends in kernels
   (:func:`gpu_busy_share`).
4. ``dense-module``: MetricMultiheadAttention(512, 8 heads) with metric
   'metric' against 'dot' on ``[8, L, 512]`` bfloat16 inputs (module and
   inputs cast), L in 1024 / 4096 / 16384.
5. ``multi30k``: the Multi30k ``base`` preset (6 + 6 layers, d = 512) trained
   for ``--multi30k-steps`` steps with 'dot' and 'metric' attention; tokens/s.

Every case runs in forward (under ``no_grad``) and forward + backward
(``out.float().sum().backward()``). A *job* (the variants of one graph /
length / dtype) runs in one fresh process (:func:`child_main`) under a
timeout; each variant builds its model afresh, memory is released and the
peak counter reset between measurements. Time: CUDA events around each step
(``perf_counter`` on a CPU), one warm-up step (Triton compiles there), then
at least 3 steps and up to ``--min-time`` seconds (at most 20 steps; a step
over 5 s is timed once). Memory: ``torch.cuda.max_memory_allocated`` during
the timed steps, minus what was allocated before (inputs and model). An
out-of-memory error becomes an ``OOM`` cell and the job goes on; another
error becomes an ``error`` cell and the job restarts in a fresh process from
the next variant; a process that runs past its time gets ``timeout`` for the
variant it was in.

The results (``DIR/gpu.json``, and ``DIR/gpu.md`` with the tables and the
issue's targets) are rewritten after every job, so a run stopped by the
device's time limit keeps what it measured. ``--tiny`` shrinks every size so
that the suite runs on a CPU in seconds (the triton variant needs
``TRITON_INTERPRET=1`` there, which the child process sets on a CPU).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import date
from pathlib import Path
from typing import Any

import torch

from benchmarks.cases import sparse_layer
from benchmarks.graphs import make_graph
from benchmarks.measure import is_out_of_memory
from benchmarks.shared import (
    ROOT,
    add_shared_arguments,
    format_cell,
    machine,
    result_key,
    size_of,
)

SPARSE_BASELINE = 'GATConv'
SPARSE_VARIANTS = ('GATConv', 'GATv2Conv', 'TransformerConv', 'metric-triton',
                   'metric-scatter', 'metric-fused')
# '-compiled': torch.compile(mode='reduce-overhead', fullgraph=True) on a GPU
# (CUDA graphs), backend 'aot_eager' on a CPU (the tiny suite checks the
# plumbing only).
COMPILED = '-compiled'
SMALL_VARIANTS = ('GATConv', 'metric-triton', 'metric-fused')
SMALL_COMPILED_VARIANTS = ('GATConv' + COMPILED, 'metric-triton' + COMPILED)
# Compiled at the sizes of the compiled target (Cora and PubMed):
# each compile costs tens of seconds of a lent GPU's time.
SMALL_COMPILED_MAX_EDGES = 100_000
# The cases whose forward + backward is also profiled (gpu_busy_share).
BUSY_VARIANTS = ('GATConv', 'metric-triton')
# '-fast': precision='fast' (no rounding estimate, no exact correction), to
# time what the default 'checked' policy costs over it.
DENSE_KERNEL_VARIANTS = ('sdpa-dot', 'metric-sdpa', 'metric-sdpa-fast')
DENSE_MODULE_VARIANTS = ('mha-dot', 'mha-metric', 'mha-metric-fast')
MULTI30K_VARIANTS = ('dot', 'metric')
MODES = ('forward', 'forward_backward')

# name -> small graphs [(nodes, edges)] (and their output width per head),
#         graphs at scale, dense lengths and shape, sparse sizes, dtypes,
#         graph kinds, Multi30k steps, the SDPA kernel check's length
SIZES: dict[str, dict[str, Any]] = {
    'full': dict(small_graphs=[(2_708, 10_556), (19_717, 88_648),
                               (169_343, 1_166_243)], small_out=16,
                 graphs=[(100_000, 2_000_000), (1_000_000, 20_000_000)],
                 lengths=[1024, 4096, 16384], batch=8, heads=8, head_dim=64,
                 sparse_heads=4, channels=64, dtypes=['float32', 'bfloat16'],
                 graph_kinds=['uniform', 'power-law'], steps=300,
                 kernel_length=4096),
    # --quick: the targets' sizes only (float32 sparse at both sizes, the
    # power-law graph at the small size, dense L = 1024 / 4096).
    'quick': dict(small_graphs=[(2_708, 10_556), (19_717, 88_648)],
                  small_out=16,
                  graphs=[(100_000, 2_000_000), (1_000_000, 20_000_000)],
                  lengths=[1024, 4096], batch=8, heads=8, head_dim=64,
                  sparse_heads=4, channels=64, dtypes=['float32'],
                  graph_kinds=['uniform', 'power-law'], steps=100,
                  kernel_length=4096),
    # --tiny: seconds on a CPU (tests).
    'tiny': dict(small_graphs=[(30, 120)], small_out=4,
                 graphs=[(60, 400)], lengths=[16], batch=2, heads=2,
                 head_dim=8, sparse_heads=2, channels=8,
                 dtypes=['float32', 'bfloat16'],
                 graph_kinds=['uniform', 'power-law'], steps=2,
                 kernel_length=16),
}
# Rough seconds per job on an H100 (process start, imports, Triton compiles
# on a cold cache, warm-up and timed steps of every variant and mode); only
# used to order and report, never to skip.
START_S = 8.0


# ------------------------------------------------------------------ steps

def dense_kernel(variant: str) -> Callable:
    import torch.nn.functional as F

    from pyg_metric_attn.nn.functional import dense_metric_attention

    if variant == 'sdpa-dot':
        return F.scaled_dot_product_attention
    if variant == 'metric-sdpa':
        return lambda q, k, v: dense_metric_attention(q, k, v)[0]
    if variant == 'metric-sdpa-fast':
        return lambda q, k, v: dense_metric_attention(q, k, v,
                                                      precision='fast')[0]
    raise ValueError(f"Unknown dense kernel variant '{variant}'")


def dense_module(variant: str, embed_dim: int, heads: int) -> torch.nn.Module:
    from pyg_metric_attn import MetricMultiheadAttention

    metric = variant.removeprefix('mha-').removesuffix('-fast')
    precision = 'fast' if variant.endswith('-fast') else 'checked'
    return MetricMultiheadAttention(embed_dim, heads, metric=metric,
                                    precision=precision)


class Job:
    """The inputs shared by the cases of one job (built once per process)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._key: tuple | None = None
        self._value: Any = None

    def shared(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key != self._key:
            self._key, self._value = None, None
            release(self.device)
            self._key, self._value = key, make()
        return self._value


def build_step(case: dict[str, Any], mode: str, job: Job) -> Callable[[], Any]:
    """A zero-argument step for one case in one mode; inputs and the model
    are made here (before the memory baseline)."""
    device = job.device
    dtype = getattr(torch, case.get('dtype', 'float32'))
    backward = mode == 'forward_backward'
    torch.manual_seed(0)
    kind = case['kind']
    if kind == 'sparse':
        def make_inputs():
            generator = torch.Generator(device=device).manual_seed(1)
            x = torch.randn(case['nodes'], case['channels'], device=device,
                            generator=generator)
            edge_index = make_graph(case['graph'], case['nodes'],
                                    case['edges'], device)
            return x, edge_index
        x, edge_index = job.shared(
            ('sparse', case['graph'], case['nodes'], case['edges'],
             case['channels']), make_inputs)
        x = x.to(dtype)
        variant = case['variant'].removesuffix(COMPILED)
        layer = sparse_layer(variant, case['channels'],
                             case.get('out_channels', case['channels']),
                             case['heads'])
        layer = layer.to(device, dtype).train(backward)
        if is_compiled(case):
            return _graded(compiled_forward(layer, x, edge_index), backward,
                           layer.parameters())
        return _graded(lambda: layer(x, edge_index), backward,
                       layer.parameters())
    if kind == 'dense-kernel':
        shape = (case['batch'], case['heads'], case['length'])
        # metric-SDPA: metric width 63, augmented to 64 (module docstring)
        width = (case['head_dim'] - 1 if case['variant'].startswith('metric')
                 else case['head_dim'])
        generator = torch.Generator(device=device).manual_seed(1)
        q, k, v = (torch.randn(*shape, w, device=device, generator=generator)
                   .to(dtype).requires_grad_(backward)
                   for w in (width, width, case['head_dim']))
        attention = dense_kernel(case['variant'])
        return _graded(lambda: attention(q, k, v), backward, (q, k, v))
    if kind == 'dense-module':
        embed_dim = case['heads'] * case['head_dim']
        generator = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(case['batch'], case['length'], embed_dim, device=device,
                        generator=generator).to(dtype)
        module = dense_module(case['variant'], embed_dim, case['heads'])
        module = module.to(device, dtype).train(backward)
        return _graded(lambda: module(x, x, x, need_weights=False)[0], backward,
                       module.parameters())
    raise ValueError(f"Unknown case kind '{kind}'")


def is_compiled(case: dict[str, Any]) -> bool:
    return case['variant'].endswith(COMPILED)


def compiled_forward(layer: torch.nn.Module, x: torch.Tensor,
                     edge_index: torch.Tensor) -> Callable[[], torch.Tensor]:
    """``layer(x, edge_index)`` under ``torch.compile(fullgraph=True)``:
    with ``mode='reduce-overhead'`` (CUDA graphs) on a GPU, each call marked
    as a new step; with the ``aot_eager`` backend on a CPU. ``fullgraph``:
    without it Dynamo splits both GATConv (3 graphs) and MetricAttentionConv
    (6) where they drop the self-loops (``nonzero``, a data-dependent size;
    until 2026-11-27 the suite compiled them so); with it each is one
    graph. One eager call first prepares the graph, as a training loop on a
    fixed graph does (examples/fixed_graph_training.py): MetricAttentionConv
    caches its structures on ``edge_index`` and the compiled graph reads
    them instead of building them (issue 60); GATConv caches nothing."""
    with torch.no_grad():
        layer(x, edge_index)
    if x.device.type != 'cuda':
        model = torch.compile(layer, backend='aot_eager', fullgraph=True)
        return lambda: model(x, edge_index)
    model = torch.compile(layer, mode='reduce-overhead', fullgraph=True)

    def forward() -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return model(x, edge_index)
    return forward


def _graded(forward: Callable[[], torch.Tensor], backward: bool,
            leaves: Iterable[torch.Tensor]) -> Callable[[], None]:
    """One step; with ``backward``, the gradients of ``leaves`` (parameters,
    inputs) are dropped before it, as a training loop's
    ``zero_grad(set_to_none=True)`` does: steps do not accumulate into
    them (under CUDA graphs a gradient a replay wrote must not be read by
    the next replay)."""
    leaves = list(leaves)

    def step() -> None:
        for leaf in leaves:
            leaf.grad = None
        with torch.set_grad_enabled(backward):
            out = forward()
            if backward:
                out.float().sum().backward()
    return step


# ------------------------------------------------------------ measurement

def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def timed(step: Callable[[], None], device: torch.device) -> float:
    """Seconds of one step: CUDA events on a GPU, ``perf_counter`` else."""
    if device.type == 'cuda':
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    step()
    return time.perf_counter() - begin


def measure(step: Callable[[], None], device: torch.device, min_time: float,
            deadline: float, warmup: int = 1) -> dict[str, Any]:
    """``warmup`` steps, then >= 3 timed steps (fewer when a step is slow
    or the deadline is near), up to ``min_time`` seconds and 20 steps."""
    begin = time.perf_counter()
    for _ in range(warmup):  # Triton and torch.compile compile, cuBLAS picks
        step()
    synchronize(device)
    warmup_s = time.perf_counter() - begin
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
    times: list[float] = []
    while True:
        times.append(timed(step, device))
        spent = sum(times)
        left = deadline - time.time()
        if len(times) >= 20 or times[-1] > 5.0 or left < 2 * times[-1] + 1:
            break
        if len(times) >= 3 and spent >= min_time:
            break
    result: dict[str, Any] = dict(
        status='ok', times_s=times, median_s=statistics.median(times),
        warmup_s=warmup_s, timing='cuda-event' if device.type == 'cuda'
        else 'perf_counter')
    if device.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(device)
        result.update(peak_mib=peak / 2**20, baseline_mib=baseline / 2**20,
                      peak_over_baseline_mib=(peak - baseline) / 2**20)
    return result


def cudagraph_skips() -> int:
    """How often Inductor has fallen back from CUDA graphs in this process
    (``mode='reduce-overhead'`` then runs its kernels one by one from the
    host). Why is logged on torch's ``cudagraphs`` log, which the child
    process turns on, so the reason lands in the job's stderr."""
    from torch._dynamo.utils import counters
    return counters['inductor']['cudagraph_skips']


def warmup_steps(case: dict[str, Any]) -> int:
    """3 for a compiled case (compile, CUDA-graph warm-up, recording), else 1."""
    return 3 if is_compiled(case) else 1


def profile_steps(step: Callable[[], None], device: torch.device,
                  steps: int) -> tuple[Any, float, float]:
    """``steps`` steps under :mod:`torch.profiler`: its averaged events, and
    per step the GPU's kernel time (memory copies and sets included; 0 on a
    CPU) in seconds and the kernels launched."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    return (events, sum(e.self_device_time_total for e in kernels) / 1e6 / steps,
            sum(e.count for e in kernels) / steps)


def gpu_busy_share(step: Callable[[], None], device: torch.device,
                   step_s: float, steps: int = 5) -> float | None:
    """The GPU's kernel time per step (:func:`profile_steps`, ``steps``
    steps) over ``step_s``, the step's median time measured without the
    profiler; None on a CPU."""
    if device.type != 'cuda':
        return None
    return profile_steps(step, device, steps)[1] / step_s


# ----------------------------------------------------- the SDPA kernel check

def classify_sdpa(names: Iterable[str]) -> str:
    """'flash', 'efficient', 'cudnn', 'math' or 'none' from profiler names
    (aten ops and CUDA kernels); a fused kernel wins over math only when no
    math op ran."""
    lowered = [name.lower() for name in names]
    if any('attention_math' in n for n in lowered):
        return 'math'
    for kind, keys in (('flash', ('flash',)), ('cudnn', ('cudnn_attention',
                                                         'cudnn')),
                       ('efficient', ('efficient', 'fmha', 'cutlass'))):
        if any(key in n for n in lowered for key in keys):
            return kind
    return 'none'


def _is_attention_name(name: str) -> bool:
    lowered = name.lower()
    return any(key in lowered for key in (
        'scaled_dot_product', 'flash', 'efficient_attention', 'fmha',
        'cudnn_attention', 'attention_math', 'attention_backward',
        'attention_forward'))


def sdpa_kernels(device: torch.device, dtype: torch.dtype = torch.bfloat16,
                 length: int = 4096, batch: int = 8, heads: int = 8,
                 head_dim: int = 64) -> dict[str, Any]:
    """Run one forward + backward of SDPA-dot, metric-SDPA and
    MetricMultiheadAttention ('metric', 'dot') under :mod:`torch.profiler`;
    per variant, the attention ops and kernels that ran and their class
    (:func:`classify_sdpa`). On a CPU the names are the CPU kernels'."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    job = Job(device)
    report: dict[str, Any] = dict(device=str(device), dtype=str(dtype),
                                  length=length, batch=batch, heads=heads,
                                  head_dim=head_dim, variants={})
    cases = [dict(kind='dense-kernel', variant=v) for v in DENSE_KERNEL_VARIANTS]
    cases += [dict(kind='dense-module', variant=v) for v in DENSE_MODULE_VARIANTS]
    for case in cases:
        case.update(length=length, batch=batch, heads=heads, head_dim=head_dim,
                    dtype=str(dtype).removeprefix('torch.'))
        try:
            step = build_step(case, 'forward_backward', job)
            step()  # warm-up outside the profile
            synchronize(device)
            with profile(activities=activities) as prof:
                step()
                synchronize(device)
            names = sorted({event.key for event in prof.key_averages()
                            if _is_attention_name(event.key)})
            report['variants'][case['variant']] = dict(
                kernel=classify_sdpa(names), names=[n[:160] for n in names])
        except Exception as error:  # noqa: BLE001 - reported, not raised
            report['variants'][case['variant']] = dict(
                kernel='OOM' if is_out_of_memory(error) else 'error',
                error=f'{type(error).__name__}: {str(error)[:300]}')
        step = None
        release(device)
    metric = report['variants'].get('metric-sdpa', {}).get('kernel')
    report['metric_sdpa_fused'] = metric in ('flash', 'efficient', 'cudnn')
    return report


# ---------------------------------------------------------- Multi30k speed

def multi30k_root(choice: str, root: str | None) -> Path | None:
    """The Multi30k folder holding ``raw/`` (or None for synthetic data)."""
    if choice == 'synthetic':
        return None
    candidates = ([Path(root)] if root else
                  [ROOT / 'datasets' / 'multi30k',
                   ROOT.parent / 'shared' / 'datasets' / 'multi30k'])
    for candidate in candidates:
        if (candidate / 'raw' / 'train.de.gz').exists():
            return candidate
    if choice == 'real':
        raise FileNotFoundError(f'no Multi30k raw files under {candidates}')
    return None


_BATCHES: dict[str, Any] = {}  # one tokenizer and batch list per process
def multi30k_batches(case: dict[str, Any], seed: int = 0):
    """``(batches, data description)``: token-id batches of the training set
    (joint BPE trained in memory: the shared folder is read-only) or, without
    the data, random ids with Multi30k-like lengths (13 +- 5 subwords)."""
    from pyg_metric_attn.datasets import (
        Multi30k,
        SubwordTokenizer,
        bucket_batches,
        pad_sequences,
    )

    generator = torch.Generator().manual_seed(seed)
    root = case.get('root')
    if root is not None:
        data = Multi30k(root, download=False)
        sentences = [s for language in data.languages
                     for s in data.sentences('train', language)]
        tokenizer = SubwordTokenizer.train(sentences, case['vocab_size'])
        src = tokenizer.encode(data.sentences('train', 'de'))
        tgt = tokenizer.encode(data.sentences('train', 'en'))
        vocab, pad = tokenizer.vocab_size, tokenizer.pad_index
        bos, eos = tokenizer.bos_index, tokenizer.eos_index
        described = f'Multi30k train de-en ({root}), joint BPE {vocab}'
    else:
        vocab, pad, bos, eos = case['vocab_size'], 0, 1, 2
        count = 29_000

        def lengths():
            return (torch.randn(count, generator=generator) * 5 + 13).round() \
                .clamp(3, 40).long().tolist()
        src = [torch.randint(3, vocab, (n,), generator=generator).tolist()
               for n in lengths()]
        tgt = [torch.randint(3, vocab, (n,), generator=generator).tolist()
               for n in lengths()]
        described = 'synthetic ids, Multi30k-like lengths (data not found)'
    sizes = [max(len(s), len(t)) + 2 for s, t in zip(src, tgt, strict=True)]
    order = bucket_batches(sizes, case['max_tokens'], generator)
    # An epoch is ~150 batches of 4096 tokens: cycle through it.
    batches = [(pad_sequences([src[i] for i in index], pad),
                pad_sequences([tgt[i] for i in index], pad, bos, eos))
               for index in (order[step % len(order)] for step in
                             range(case['steps'] + case['warmup']))]
    return batches, dict(data=described, vocab_size=vocab, pad_index=pad)


def multi30k_speed(case: dict[str, Any], device: torch.device,
                   deadline: float) -> dict[str, Any]:
    """Train the ``base`` preset (or the case's overrides) for the case's
    steps on the batches of :func:`multi30k_batches`; tokens per second
    (source + target tokens that are not padding)."""
    from pyg_metric_attn.experiments.tasks.multi30k import preset_config
    from pyg_metric_attn.nn.models import MetricTransformer

    o = dataclasses.replace(preset_config(case['preset'])[0],
                            **case.get('overrides', {}))
    data_key = json.dumps([case.get('root'), case['steps'], case['warmup'],
                           o.vocab_size, o.max_tokens])
    if data_key not in _BATCHES:
        _BATCHES[data_key] = multi30k_batches(
            case | dict(vocab_size=o.vocab_size, max_tokens=o.max_tokens))
    batches, info = _BATCHES[data_key]
    torch.manual_seed(0)
    model = MetricTransformer(
        info['vocab_size'], info['vocab_size'], d_model=o.d_model,
        num_heads=o.num_heads, num_encoder_layers=o.num_layers,
        num_decoder_layers=o.num_layers,
        dim_feedforward=o.dim_feedforward, dropout=o.dropout,
        attention=case['variant'], norm_first=o.norm_first,
        share_embeddings=o.share_embeddings, pad_index=info['pad_index'],
        time_scale=o.time_scale).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=o.lr,
                                 betas=(0.9, 0.98), eps=o.adam_eps,
                                 weight_decay=o.weight_decay)
    pad = info['pad_index']

    def train_step(batch) -> None:
        src, tgt = (t.to(device, non_blocking=True) for t in batch)
        loss = model.loss(src, tgt, label_smoothing=o.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()

    for batch in batches[:case['warmup']]:
        train_step(batch)
    synchronize(device)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    timed_batches = batches[case['warmup']:]
    tokens, steps = 0, 0
    begin = time.perf_counter()
    for batch in timed_batches:
        train_step(batch)
        tokens += sum(int((t != pad).sum()) for t in batch)
        steps += 1
        if time.time() > deadline - 5:
            break
    synchronize(device)
    seconds = time.perf_counter() - begin
    result = dict(status='ok', steps=steps, seconds=seconds,
                  median_s=seconds / max(steps, 1),
                  tokens_per_s=tokens / seconds, tokens=tokens,
                  parameters=sum(p.numel() for p in model.parameters()),
                  timing='perf_counter over all steps', **info)
    if device.type == 'cuda':
        result['peak_mib'] = torch.cuda.max_memory_allocated(device) / 2**20
    return result


# ------------------------------------------------------------- the jobs

def jobs(size: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The suite's jobs in priority order: ``{name, estimate_s, cases}``."""
    s = SIZES[size]
    out: list[dict[str, Any]] = []
    dense = dict(batch=s['batch'], heads=s['heads'], head_dim=s['head_dim'],
                 dtype='bfloat16')
    out.append(dict(name=f"sdpa-kernels L={s['kernel_length']}",
                    kind='sdpa-kernels', estimate_s=START_S + 10,
                    cases=[dict(kind='sdpa-kernels', variant='profile',
                                length=s['kernel_length'], **dense)]))

    def dense_job(kind, variants, length, estimate):
        return dict(name=f'{kind} L={length} bfloat16', kind=kind,
                    estimate_s=START_S + estimate,
                    cases=[dict(kind=kind, variant=v, length=length, **dense)
                           for v in variants])

    def sparse_job(graph, nodes, edges, dtype):
        big = edges >= 10_000_000
        estimate = (90 if big else 25) * (1.0 if dtype == 'float32' else 0.8)
        busy = (nodes, edges) == s['graphs'][0] and dtype == 'float32' \
            and graph == 'uniform'
        return dict(name=f'sparse {graph} {_short(nodes)}/{_short(edges)} '
                         f'{dtype}', kind='sparse', estimate_s=START_S + estimate,
                    cases=[dict(kind='sparse', variant=v, graph=graph,
                                nodes=nodes, edges=edges, dtype=dtype,
                                heads=s['sparse_heads'], channels=s['channels'])
                           | (dict(busy=True) if busy and v in BUSY_VARIANTS
                              else {})
                           for v in SPARSE_VARIANTS])

    def small_job(nodes, edges):
        variants = SMALL_VARIANTS
        if edges <= SMALL_COMPILED_MAX_EDGES:
            variants += SMALL_COMPILED_VARIANTS
        return dict(name=f'sparse small {_short(nodes)}/{_short(edges)} '
                         'float32', kind='sparse',
                    estimate_s=START_S + 10 + 20 * (len(variants) - 3)
                    + edges / 1e5,
                    cases=[dict(kind='sparse', variant=v, graph='uniform',
                                nodes=nodes, edges=edges, dtype='float32',
                                heads=s['sparse_heads'], channels=s['channels'],
                                out_channels=s['small_out'])
                           for v in variants])

    lengths = s['lengths']
    # Targets first: dense L = 4096 (or the largest quick length), sparse
    # float32 uniform at both sizes; then the rest.
    target_length = s['kernel_length']
    out.append(dense_job('dense-kernel', DENSE_KERNEL_VARIANTS, target_length, 6))
    for nodes, edges in s['small_graphs']:
        out.append(small_job(nodes, edges))
    (small, small_e), *rest = s['graphs']
    out.append(sparse_job('uniform', small, small_e, 'float32'))
    for nodes, edges in rest:
        out.append(sparse_job('uniform', nodes, edges, 'float32'))
    for length in lengths:
        if length != target_length:
            out.append(dense_job('dense-kernel', DENSE_KERNEL_VARIANTS, length,
                                 4 if length < 16384 else 12))
    for length in lengths:
        out.append(dense_job('dense-module', DENSE_MODULE_VARIANTS, length,
                             5 if length < 16384 else 15))
    if 'power-law' in s['graph_kinds']:
        out.append(sparse_job('power-law', small, small_e, 'float32'))
    if 'bfloat16' in s['dtypes']:
        out.append(sparse_job('uniform', small, small_e, 'bfloat16'))
        if 'power-law' in s['graph_kinds']:
            out.append(sparse_job('power-law', small, small_e, 'bfloat16'))
    if size != 'quick':
        for nodes, edges in rest:
            if 'power-law' in s['graph_kinds']:
                out.append(sparse_job('power-law', nodes, edges, 'float32'))
            if 'bfloat16' in s['dtypes']:
                out.append(sparse_job('uniform', nodes, edges, 'bfloat16'))
                if 'power-law' in s['graph_kinds']:
                    out.append(sparse_job('power-law', nodes, edges,
                                          'bfloat16'))
    if args.multi30k != 'off':
        root = multi30k_root(args.multi30k, args.multi30k_root)
        steps = args.multi30k_steps or s['steps']
        overrides = (dict(num_layers=1, d_model=16, num_heads=2,
                          dim_feedforward=32, max_tokens=256, vocab_size=300)
                     if size == 'tiny' else {})
        out.append(dict(
            name=f'multi30k base {steps} steps', kind='multi30k',
            estimate_s=START_S + 15 + 2 * (10 + steps * 0.08),
            cases=[dict(kind='multi30k', variant=v, preset='base',
                        steps=steps, warmup=min(10, steps),
                        root=None if root is None else str(root),
                        overrides=overrides)
                   for v in MULTI30K_VARIANTS]))
    selected = []
    for job in out:
        if args.only and not any(word in job['name'] for word in args.only):
            continue
        if args.variants:
            job = job | dict(cases=[c for c in job['cases']
                                    if c['variant'] in args.variants
                                    or c['kind'] in ('sdpa-kernels',)])
            if not job['cases']:
                continue
        selected.append(job)
    return selected


def _short(n: int) -> str:
    for unit, scale in (('M', 10**6), ('k', 10**3)):
        if n >= scale and n % scale == 0:
            return f'{n // scale}{unit}'
    return str(n)


def case_modes(case: dict[str, Any]) -> tuple[str, ...]:
    if case['kind'] == 'multi30k':
        return ('train', )
    if case['kind'] == 'sdpa-kernels' or is_compiled(case):
        return ('forward_backward', )
    return MODES


# ---------------------------------------------------------- child process

def child_main(job_path: str, results_path: str, device_name: str,
               min_time: float, deadline: float) -> None:
    """Run a job's (case, mode) items in order, appending one JSON line per
    item to ``results_path`` (a ``start`` line before each)."""
    device = torch.device(device_name)
    cases = json.loads(Path(job_path).read_text())
    if any(is_compiled(item['case']) for item in cases):
        torch._logging.set_logs(cudagraphs=True)  # why CUDA graphs were skipped
    job = Job(device)
    with open(results_path, 'a') as log:
        def write(record: dict[str, Any]) -> None:
            log.write(json.dumps(record) + '\n')
            log.flush()
            os.fsync(log.fileno())

        for item in cases:
            case, mode = item['case'], item['mode']
            key = item['key']
            if time.time() > deadline - 3:
                write(dict(key=key, status='skipped', error='suite budget'))
                continue
            write(dict(key=key, event='start'))
            step = None
            try:
                if case['kind'] == 'sdpa-kernels':
                    result = dict(status='ok', kernels=sdpa_kernels(
                        device, getattr(torch, case['dtype']), case['length'],
                        case['batch'], case['heads'], case['head_dim']))
                elif case['kind'] == 'multi30k':
                    result = multi30k_speed(case, device, deadline)
                else:
                    step = build_step(case, mode, job)
                    skips = cudagraph_skips()
                    result = measure(step, device, min_time, deadline,
                                     warmup_steps(case))
                    if is_compiled(case) and device.type == 'cuda':
                        result['cudagraph_skips'] = cudagraph_skips() - skips
                    if case.get('busy') and mode == 'forward_backward':
                        result['gpu_busy_share'] = gpu_busy_share(
                            step, device, result['median_s'])
            except Exception as error:  # noqa: BLE001 - becomes a cell
                step = None
                oom = is_out_of_memory(error)
                write(dict(key=key, status='OOM' if oom else 'error',
                           error=f'{type(error).__name__}: {str(error)[:400]}'))
                if not oom:  # the CUDA context may be broken: a fresh process
                    sys.exit(3)
            else:
                write(dict(key=key, **result))
            step = None
            release(device)


# ---------------------------------------------------------------- runner

def run_job(job: dict[str, Any], args: argparse.Namespace, deadline: float,
            log_dir: Path, previous: dict[str, dict[str, Any]] | None = None
            ) -> list[dict[str, Any]]:
    """All (case, mode) results of one job; restarts a fresh process after
    an error or a timeout until every item has a result or the budget is
    spent. Items with a final result in ``previous`` (by :func:`result_key`;
    anything but ``skipped``) are not run again."""
    items = [dict(key=f'{i}:{mode}', case=case, mode=mode)
             for i, case in enumerate(job['cases']) for mode in case_modes(case)]
    done: dict[str, dict[str, Any]] = {}
    for item in items:
        old = (previous or {}).get(result_key(item['case'], item['mode']))
        if old is not None and old['status'] != 'skipped':
            done[item['key']] = {k: v for k, v in old.items()
                                 if k not in ('case', 'mode', 'job')}
    env = dict(os.environ, PYTHONUNBUFFERED='1')
    if args.device == 'cpu':
        env.setdefault('TRITON_INTERPRET', '1')
    for _ in range(len(items)):
        todo = [item for item in items if item['key'] not in done]
        left = deadline - time.time()
        if not todo:
            break
        if left < 10:
            for item in todo:
                done[item['key']] = dict(status='skipped', error='suite budget')
            break
        with tempfile.TemporaryDirectory() as tmp:
            job_path, results_path = Path(tmp) / 'job.json', Path(tmp) / 'out.jsonl'
            job_path.write_text(json.dumps(todo))
            results_path.touch()
            timeout = min(args.timeout, left)
            command = [sys.executable, '-m', 'benchmarks.gpu_cases', 'child',
                       str(job_path), str(results_path), args.device,
                       str(args.min_time), str(deadline)]
            stderr_path = log_dir / 'stderr.txt'
            with open(stderr_path, 'a') as stderr:
                stderr.write(f"\n=== {job['name']} ({len(todo)} items)\n")
                stderr.flush()
                try:
                    status = subprocess.run(command, cwd=ROOT, env=env,
                                            stdout=stderr, stderr=stderr,
                                            timeout=timeout).returncode
                except subprocess.TimeoutExpired:
                    status = 'timeout'
            started = None
            for line in results_path.read_text().splitlines():
                record = json.loads(line)
                if record.get('event') == 'start':
                    started = record['key']
                    continue
                done[record.pop('key')] = record
                started = None
        if started is not None and started not in done:
            tail = _tail(stderr_path)
            done[started] = (dict(status='timeout', error=f'over {timeout:.0f} s')
                             if status == 'timeout' else
                             dict(status='error', error=f'process exit {status}: '
                                  f'{tail}'))
        elif status not in (0, 3) and not any(
                item['key'] in done for item in todo):
            # Died before its first item (an import error, say): give up.
            for item in todo:
                done[item['key']] = dict(status='error', error=(
                    f'process exit {status}: {_tail(stderr_path)}'))
            break
    return [dict(case=item['case'], mode=item['mode'], job=job['name'],
                 **done.get(item['key'], dict(status='skipped')))
            for item in items]


def _tail(path: Path, lines: int = 3) -> str:
    with contextlib.suppress(OSError):
        return ' | '.join(path.read_text().strip().splitlines()[-lines:])[-400:]
    return ''


def versions() -> dict[str, Any]:
    """Versions and which optional packages import (in this process)."""
    import importlib

    info: dict[str, Any] = dict(python=platform.python_version(),
                                torch=torch.__version__,
                                cuda=torch.version.cuda)
    for name in ('torch_geometric', 'triton', 'torch_scatter', 'torch_sparse'):
        try:
            info[name] = getattr(importlib.import_module(name), '__version__', '?')
        except Exception as error:  # noqa: BLE001 - a missing package is data
            info[name] = f'not importable ({type(error).__name__})'
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info['gpu'] = (f'{props.name}, {props.total_memory / 2**30:.0f} GiB, '
                       f'{props.multi_processor_count} SMs')
    return info


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['child']:
        _, job_path, results_path, device, min_time, deadline = argv
        if device == 'cpu':
            os.environ.setdefault('TRITON_INTERPRET', '1')
        child_main(job_path, results_path, device, float(min_time),
                   float(deadline))
        return
    args = parse_args(argv)
    size = size_of(args)
    plan = jobs(size, args)
    if args.dry_run:
        total = 0.0
        for job in plan:
            total += job['estimate_s']
            print(f"{job['estimate_s']:6.0f} s  {job['name']}  "
                  f"({sum(len(case_modes(c)) for c in job['cases'])} items)")
        print(f'{total:6.0f} s  estimated in all (budget {args.budget_s:.0f} s)')
        return
    start = time.time()
    deadline = start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    name = 'gpu-tiny' if args.tiny else 'gpu'
    meta = dict(command='python -m benchmarks.run ' + ' '.join(argv),
                size=size, device=args.device, date=date.today().isoformat(),
                budget_s=args.budget_s, machine=machine(), **versions())
    results: list[dict[str, Any]] = []
    previous: dict[str, dict[str, Any]] = {}
    path = args.out / f'{name}.json'
    if args.resume and path.exists():
        earlier = json.loads(path.read_text())
        previous = {result_key(r['case'], r['mode']): r
                    for r in earlier['results']}
        meta['earlier_runs'] = earlier['meta'].get('earlier_runs', []) + [
            dict(date=earlier['meta']['date'],
                 wall_s=earlier['meta'].get('wall_s'))]
    # Earlier results of jobs this call does not select (--only, --variants)
    # stay in the file and its tables.
    planned = {result_key(case, mode) for job in plan for case in job['cases']
               for mode in case_modes(case)}
    others = [r for key, r in previous.items() if key not in planned]
    for number, job in enumerate(plan, 1):
        job_start = time.time()
        print(f"[{time.time() - start:5.0f} s] {number}/{len(plan)} "
              f"{job['name']} (estimate {job['estimate_s']:.0f} s)", flush=True)
        results += run_job(job, args, deadline, args.out, previous)
        for result in results[-sum(len(case_modes(c)) for c in job['cases']):]:
            print('    ' + _summary(result), flush=True)
        meta['wall_s'] = time.time() - start
        meta.setdefault('job_wall_s', {})[job['name']] = time.time() - job_start
        write_results(args.out, name, meta, results + others)
    print(report(meta, results + others))


def write_results(out: Path, name: str, meta: dict[str, Any],
                  results: list[dict[str, Any]]) -> None:
    from pyg_metric_attn.utils.io import atomic_write_json, atomic_write_text

    atomic_write_json(out / f'{name}.json', dict(meta=meta, results=results))
    atomic_write_text(out / f'{name}.md', report(meta, results))


def _summary(result: dict[str, Any]) -> str:
    case = result['case']
    label = f"{case['variant']} {result['mode']}"
    if result['status'] != 'ok':
        return f"{label}: {result['status']} {result.get('error', '')[:150]}"
    if 'kernels' in result:
        return label + ': ' + ', '.join(
            f"{k}={v['kernel']}" for k, v in result['kernels']['variants'].items())
    if 'tokens_per_s' in result:
        return f"{label}: {result['tokens_per_s']:.0f} tokens/s"
    memory = result.get('peak_over_baseline_mib')
    return (f"{label}: {result['median_s'] * 1e3:.2f} ms" +
            (f', +{memory:.0f} MiB' if memory is not None else ''))


# ---------------------------------------------------------------- report

def _find(results, mode, **want) -> dict[str, Any] | None:
    for result in results:
        if result['mode'] == mode and all(result['case'].get(k) == v
                                          for k, v in want.items()):
            return result
    return None


def _ok(result: dict[str, Any] | None) -> bool:
    return result is not None and result['status'] == 'ok'


# Issue 26 §4 (the layer) and issue 27 §4 (dense attention): the bound of
# each ratio; a time ratio is the variant's median over its baseline's.
SMALL_TIME_BOUND = 1.0
SPARSE_TIME_BOUND = {'float32': 0.20, 'bfloat16': 0.30}
SPARSE_MEMORY_BOUND = 0.12
POWER_LAW_BOUND = 1.10
BUSY_BOUND = 0.80
BIG_MEMORY_BOUND = 5.0
DENSE_TIME_BOUND = {1024: 1.3, 4096: 1.10, 16384: 1.05}


def targets(results: list[dict[str, Any]], size: str) -> list[tuple]:
    """(target, measured, bound, met) rows of the issues' GPU targets."""
    s = SIZES[size]
    rows: list[tuple] = []

    def ratio_row(label, numerator, denominator, bound, key='median_s',
                  at_most=True):
        if _ok(numerator) and _ok(denominator) and key in numerator \
                and key in denominator:
            ratio = numerator[key] / max(denominator[key], 1e-12)
            met = ratio <= bound if at_most else ratio >= bound
            rows.append((label, f'{ratio:.3f}',
                         f"{'<=' if at_most else '>='} {bound}", met))
        else:
            rows.append((label, 'not measured: ' + _statuses(numerator,
                                                             denominator),
                         f"{'<=' if at_most else '>='} {bound}", False))

    fwd_bwd = 'forward_backward'
    for nodes, edges in s['small_graphs']:
        where = dict(kind='sparse', graph='uniform', dtype='float32',
                     nodes=nodes, edges=edges)
        for suffix, how in (('', 'eager'), (COMPILED, 'reduce-overhead')):
            ratio_row(f'metric-triton / GATConv time, {_short(nodes)}/'
                      f'{_short(edges)} float32 fwd+bwd, {how}',
                      _find(results, fwd_bwd, variant='metric-triton' + suffix,
                            **where),
                      _find(results, fwd_bwd, variant='GATConv' + suffix,
                            **where), SMALL_TIME_BOUND)
    (n1, e1), *big = s['graphs']
    at_n1 = f'{_short(n1)}/{_short(e1)}'
    for dtype, bound in SPARSE_TIME_BOUND.items():
        where = dict(kind='sparse', graph='uniform', dtype=dtype, nodes=n1,
                     edges=e1)
        tri = _find(results, fwd_bwd, variant='metric-triton', **where)
        gat = _find(results, fwd_bwd, variant='GATConv', **where)
        ratio_row(f'metric-triton / GATConv time, {at_n1} {dtype} fwd+bwd',
                  tri, gat, bound)
        if dtype == 'float32':
            ratio_row(f'metric-triton / GATConv peak memory, {at_n1} float32 '
                      'fwd+bwd', tri, gat, SPARSE_MEMORY_BOUND,
                      key='peak_over_baseline_mib')
            ratio_row(f'metric-triton power-law / uniform time, {at_n1} '
                      'float32 fwd+bwd',
                      _find(results, fwd_bwd, variant='metric-triton',
                            **(where | dict(graph='power-law'))),
                      tri, POWER_LAW_BOUND)
            label = f'metric-triton GPU busy share, {at_n1} float32 fwd+bwd'
            if _ok(tri) and tri.get('gpu_busy_share') is not None:
                share = tri['gpu_busy_share']
                rows.append((label, f'{share:.2f}', f'>= {BUSY_BOUND}',
                             share >= BUSY_BOUND))
            else:
                rows.append((label, 'not measured: ' + _statuses(tri),
                             f'>= {BUSY_BOUND}', False))
    for nodes, edges in big:
        where = dict(kind='sparse', graph='uniform', dtype='float32',
                     nodes=nodes, edges=edges)
        gat = _find(results, fwd_bwd, variant='GATConv', **where)
        tri = _find(results, fwd_bwd, variant='metric-triton', **where)
        label = (f'GATConv / metric-triton peak memory, {_short(nodes)}/'
                 f'{_short(edges)} float32 fwd+bwd')
        if _ok(tri) and gat is not None and gat['status'] == 'OOM':
            rows.append((label, 'GATConv OOM, metric-triton ran',
                         f'>= {BIG_MEMORY_BOUND}', True))
        else:
            ratio_row(label, gat, tri, BIG_MEMORY_BOUND,
                      key='peak_over_baseline_mib', at_most=False)
    for kind, metric, dot in (('dense-kernel', 'metric-sdpa', 'sdpa-dot'),
                              ('dense-module', 'mha-metric', 'mha-dot')):
        for length in s['lengths']:
            for mode in MODES:
                ratio_row(f'{metric} / {dot} time, L={length} bfloat16 {mode}',
                          _find(results, mode, kind=kind, variant=metric,
                                length=length),
                          _find(results, mode, kind=kind, variant=dot,
                                length=length),
                          DENSE_TIME_BOUND.get(length, DENSE_TIME_BOUND[1024]))
    check = next((r for r in results if 'kernels' in r), None)
    if check is not None:
        variants = check['kernels']['variants']
        rows.append(('metric-SDPA SDPA kernel (fwd+bwd, bfloat16)',
                     variants.get('metric-sdpa', {}).get('kernel', '?'),
                     'flash / efficient / cudnn',
                     check['kernels']['metric_sdpa_fused']))
    return rows


def _statuses(*results) -> str:
    return ', '.join('absent' if r is None else r['status'] for r in results)


def table(results: list[dict[str, Any]], baseline: str, key: str,
          scale: float, digits: int) -> str:
    """One row per (sizes, mode), one column per variant: ``value (ratio
    to the baseline)``."""
    rows: dict[tuple, dict[str, dict]] = {}
    variants: list[str] = []
    for result in results:
        case = result['case']
        variants.append(case['variant'])
        sizes = (f"{case['graph']} {_short(case['nodes'])}/"
                 f"{_short(case['edges'])} {case['dtype']}"
                 if case['kind'] == 'sparse'
                 else f"L={case['length']} {case['dtype']}")
        rows.setdefault((sizes, result['mode']), {})[case['variant']] = result
    variants = list(dict.fromkeys(variants))
    lines = ['| case | mode | ' + ' | '.join(variants) + ' |',
             '|---|---|' + '---|' * len(variants)]
    for (sizes, mode), by_variant in rows.items():
        cells = [format_cell(by_variant.get(v), by_variant.get(baseline), key, scale,
                       digits) for v in variants]
        lines.append(f'| {sizes} | {mode} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def _per_cell(title: str, results: list[dict[str, Any]], column: str,
              value: Callable[[dict[str, Any]], str]) -> list[str]:
    """A heading and a table of one value per sparse cell."""
    return [f'### {title}', '\n'.join(
        [f'| case | variant | {column} |', '|---|---|---|'] + [
            f"| {r['case']['graph']} {_short(r['case']['nodes'])}/"
            f"{_short(r['case']['edges'])} {r['case']['dtype']} | "
            f"{r['case']['variant']} | {value(r)} |" for r in results])]


def report(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    memory = ('peak GPU memory allocated during the steps over what was '
              'allocated before (inputs, model), MiB'
              if meta['device'] != 'cpu' else 'not measured on a CPU')
    parts = [f"## GPU suite ({meta['size']} sizes) on {meta['device']}",
             f"`{meta['command']}`; {meta.get('gpu', meta['machine'])}; torch "
             f"{meta['torch']} (CUDA {meta['cuda']}), torch_geometric "
             f"{meta['torch_geometric']}, triton {meta['triton']}, "
             f"torch_scatter {meta['torch_scatter']}, torch_sparse "
             f"{meta['torch_sparse']}; {meta['date']}; wall time "
             f"{meta.get('wall_s', 0) / 60:.1f} min of a "
             f"{meta['budget_s'] / 60:.1f} min budget.",
             "### The issue's targets",
             '| target | measured | bound | met |\n|---|---|---|---|\n' +
             '\n'.join(f'| {t} | {m} | {b} | {"yes" if ok else "**no**"} |'
                       for t, m, b, ok in targets(results, meta['size']))]
    check = next((r for r in results if 'kernels' in r), None)
    if check is not None:
        k = check['kernels']
        parts.append(f"### SDPA kernels (fwd+bwd, {k['dtype']}, L={k['length']},"
                     f" batch {k['batch']}, {k['heads']} heads, d {k['head_dim']})")
        lines = ['| variant | kernel | ops and kernels seen |', '|---|---|---|']
        for variant, info in k['variants'].items():
            seen = '; '.join(info.get('names', [])[:6]) or info.get('error', '')
            lines.append(f"| {variant} | {info['kernel']} | {seen} |")
        parts.append('\n'.join(lines))
    for select, baseline, title in (
            (lambda c: c['kind'] == 'sparse' and 'out_channels' in c,
             SPARSE_BASELINE, 'Sparse layers at small sizes ({channels} -> '
             '{heads} heads x {out_channels}, one layer)'),
            (lambda c: c['kind'] == 'sparse' and 'out_channels' not in c,
             SPARSE_BASELINE, 'Sparse layers ({channels} -> {heads} heads x '
             '{channels}, one layer)'),
            (lambda c: c['kind'] == 'dense-kernel', 'sdpa-dot',
             'Dense kernels ([{batch}, {heads}, L, {head_dim}])'),
            (lambda c: c['kind'] == 'dense-module', 'mha-dot',
             'MetricMultiheadAttention ({heads} heads x {head_dim}, batch '
             '{batch})')):
        chosen = [r for r in results if select(r['case'])]
        if chosen:
            title = title.format(**chosen[0]['case'])
            parts += [f'### {title}: median time per step, ms (ratio to '
                      f'{baseline})',
                      table(chosen, baseline, 'median_s', 1e3, 2),
                      f'### {title}: memory ({memory})',
                      table(chosen, baseline, 'peak_over_baseline_mib', 1.0, 0)]
    busy = [r for r in results if r.get('gpu_busy_share') is not None]
    if busy:
        parts += _per_cell('GPU busy share of a fwd+bwd step (kernel time over '
                           'the step, profiled)', busy, 'share',
                           lambda r: f"{r['gpu_busy_share']:.2f}")
    compiled = [r for r in results if 'cudagraph_skips' in r]
    if compiled:
        parts += _per_cell("CUDA graphs under `mode='reduce-overhead'` "
                           "(Inductor's fallbacks to launching from the host; "
                           "why: the job's stderr)", compiled, 'fallbacks',
                           lambda r: str(r['cudagraph_skips']))
    speed = [r for r in results if r['case']['kind'] == 'multi30k']
    if speed:
        lines = ['| attention | status | tokens/s | steps | ms/step | peak MiB '
                 '| data |', '|---|---|---|---|---|---|---|']
        for r in speed:
            if r['status'] == 'ok':
                lines.append(f"| {r['case']['variant']} | ok | "
                             f"{r['tokens_per_s']:.0f} | {r['steps']} | "
                             f"{r['median_s'] * 1e3:.1f} | "
                             f"{r.get('peak_mib', float('nan')):.0f} | "
                             f"{r['data']} |")
            else:
                lines.append(f"| {r['case']['variant']} | {r['status']} | | | "
                             f"| | {r.get('error', '')[:120]} |")
        parts += ['### Multi30k `base` preset training speed (float32)',
                  '\n'.join(lines)]
    return '\n\n'.join(parts) + '\n'


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='python -m benchmarks.run --suite gpu',
        description='The GPU suite (see benchmarks/gpu_cases.py).')
    parser.add_argument('--suite', choices=['gpu'], default='gpu')
    add_shared_arguments(
        parser, device='cuda' if torch.cuda.is_available() else 'cpu',
        timeout=300.0,
        quick='the targets only: float32 sparse, power-law at 100k only, '
              'dense L in {1024, 4096}',
        tiny='tiny sizes that run on a CPU in seconds (tests)',
        resume='keep the results in OUT/gpu.json that are not "skipped" and '
               'run only the rest (results of jobs not selected now stay in '
               'the file)')
    parser.add_argument('--budget-s', type=float, default=540.0,
                        help='stop starting work after this many seconds; '
                             'results so far are kept (default 540)')
    parser.add_argument('--min-time', type=float, default=1.0,
                        help='time fast steps for about this long (default 1)')
    parser.add_argument('--only', nargs='+', default=None,
                        help='jobs whose name contains one of these words '
                             '(e.g. sparse, dense-kernel, sdpa-kernels, 1M, '
                             'bfloat16, multi30k)')
    parser.add_argument('--multi30k', choices=['auto', 'real', 'synthetic', 'off'],
                        default='auto',
                        help="Multi30k speed job: 'auto' uses the raw files "
                             'under datasets/multi30k or ../shared/datasets/'
                             'multi30k, else synthetic ids (default auto)')
    parser.add_argument('--multi30k-root', default=None)
    parser.add_argument('--multi30k-steps', type=int, default=None,
                        help='timed training steps (default 300; quick 100)')
    parser.add_argument('--dry-run', action='store_true',
                        help='print the jobs and estimates, run nothing')
    return parser.parse_args(argv)


if __name__ == '__main__':
    main()
