r"""The graph as the kernels read it, prepared once per graph.

:func:`prepare_triton_graph` checks a destination-sorted CSR graph (the
kernels index memory with it, so a bad index must never reach them), builds
the destination row of every edge, the transposed (CSC) view for the
deterministic backward, and the *work schedules* over rows and columns. It is
all torch ops on the graph's device (and one read of the schedules' sizes,
see below); a caller that reuses a graph (full-batch training)
caches the returned :class:`TritonGraph` (the layer does so with
:func:`~pyg_metric_attn.utils.graph_cache.cached`).

**Long rows (skewed degrees).** A segment (a row, or a column of the
transpose) is cut into chunks of at most ``chunk`` entries (default
``ROW_CHUNK``); each chunk is a work item of its own, so a hub of degree
:math:`10^6` runs on ~1000 programs instead of serialising one. Chunks of a
split segment write partial results to a float32 scratch of at most
:math:`2E/\mathrm{chunk}` slots, and a second kernel merges a segment's
chunks *in chunk order*, so results do not depend on scheduling. The number
of items is bounded by ``N + E // chunk`` (known on the host), and of split
segments by ``E // chunk``; sized by these bounds the schedules need no host
read, and idle items exit at once. Outside :func:`torch.compile` the
preparation reads the counts back once per graph and trims both schedules
to them, so a graph without long rows launches no merge at all (one host
read per prepared graph; under :func:`torch.compile` the bounds stay, and
nothing synchronises).

**Transpose.** The source-side gradients of the deterministic backward run
over the edges sorted stably by source
(:func:`~pyg_metric_attn.utils.csr.sort_by_segment`): per CSC entry the
destination row (for :math:`q_i`, ``dout_i`` and the row state) and the
CSR position (for the edge bias, the weight gradient and the dropout
counter).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from pyg_metric_attn.utils.csr import segment_ids, sort_by_segment

#: Longest run of edges one program handles; longer rows and columns are split.
ROW_CHUNK: int = 1024


@dataclass(frozen=True)
class Schedule:
    """Work items over the segments of a CSR pointer.

    ``items``: int64 ``[4, n_items]`` = (segment or -1 if idle, first entry,
    end entry, scratch slot or -1 if written directly). ``split``: int64
    ``[3, n_split]`` = (segment or -1, first slot, end slot) for the segments
    cut into several chunks.
    """
    items: Tensor
    split: Tensor

    @property
    def n_items(self) -> int:
        return self.items.size(1)

    @property
    def n_split(self) -> int:
        return self.split.size(1)

    def used(self) -> list[Tensor]:
        """How many items and split segments are not idle (two counts on the
        device): the valid ones come first."""
        return [(self.items[0] >= 0).sum(), (self.split[0] >= 0).sum()]

    def trimmed(self, n_items: int, n_split: int) -> Schedule:
        """The first ``n_items`` items and ``n_split`` split segments."""
        return Schedule(self.items[:, :n_items].contiguous(),
                        self.split[:, :n_split].contiguous())


class GraphTensors(list):
    """The index tensors of one prepared graph, as the custom operators take
    them (:meth:`TritonGraph.tensors`), and the launch plans worked out for
    that graph (``plans``, filled by :mod:`.function`): the same object at
    every call on the graph, so that a repeated step finds its plans."""
    def __init__(self, tensors: list[Tensor]):
        super().__init__(tensors)
        self.plans: dict = {}


def scratch_slots(num_entries: int, chunk: int) -> int:
    """Scratch rows the split segments need: each has degree > ``chunk``, so
    there are at most ``E // chunk`` of them with < ``2 E / chunk`` chunks."""
    return 2 * (num_entries // chunk) + 1


def segment_schedule(ptr: Tensor, num_entries: int, chunk: int) -> Schedule:
    """The work items over the segments of ``ptr`` (see the module notes)."""
    n = ptr.numel() - 1
    device = ptr.device
    nchunk = ((ptr.diff() + chunk - 1) // chunk).clamp_min(1)
    item_end = nchunk.cumsum(0)
    item_begin = item_end - nchunk
    items = torch.arange(n + num_entries // chunk, device=device)
    seg = torch.searchsorted(item_end, items, right=True)
    valid = seg < n
    seg_c = seg.clamp_max(n - 1)
    k = items - item_begin[seg_c]
    lo = ptr[seg_c] + k * chunk
    hi = torch.minimum(lo + chunk, ptr[seg_c + 1])
    is_split = nchunk > 1
    slot_end = torch.where(is_split, nchunk, 0).cumsum(0)
    slot_begin = slot_end - torch.where(is_split, nchunk, 0)
    slot = torch.where(is_split[seg_c], slot_begin[seg_c] + k, -1)
    sched = torch.stack([torch.where(valid, seg, -1), torch.where(valid, lo, 0),
                         torch.where(valid, hi, 0), torch.where(valid, slot, -1)])

    sids = torch.arange(num_entries // chunk, device=device)
    sseg = torch.searchsorted(is_split.long().cumsum(0), sids, right=True)
    svalid = sseg < n
    sseg_c = sseg.clamp_max(n - 1)
    split = torch.stack([torch.where(svalid, sseg, -1),
                         torch.where(svalid, slot_begin[sseg_c], 0),
                         torch.where(svalid, slot_end[sseg_c], 0)])
    return Schedule(sched.contiguous(), split.contiguous())


@dataclass(frozen=True)
class TritonGraph:
    """A destination-sorted CSR graph, checked, with its schedules (and its
    transpose when the deterministic backward needs one): what
    :func:`~pyg_metric_attn.nn.triton.triton_metric_attention` reads besides
    the features. Build it with :func:`prepare_triton_graph`."""
    rowptr: Tensor           # int64 [N_dst + 1]
    col: Tensor              # int32/int64 [E], contiguous
    row: Tensor              # int64 [E]: the destination of every edge
    rows: Schedule
    num_src: int
    chunk: int
    csc_row: Tensor | None   # int64 [E]: destination of every CSC entry
    csc_edge: Tensor | None  # int64 [E]: its CSR position
    cols: Schedule | None
    _views: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_dst(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @property
    def has_transpose(self) -> bool:
        return self.cols is not None

    def tensors(self, transpose: bool = True) -> list[Tensor]:
        """The index tensors, in the order :meth:`from_tensors` takes them
        (the custom operators take tensors, not this object); with
        ``transpose`` those of the transpose too, where the graph has it.
        Outside :func:`torch.compile` one :class:`GraphTensors` per choice,
        made once."""
        transpose = transpose and self.cols is not None
        views = self._views.get(transpose)
        if views is not None and not torch.compiler.is_compiling():
            return views
        tensors = [self.rowptr, self.col, self.row, self.rows.items,
                   self.rows.split]
        if transpose:
            tensors += [self.csc_row, self.csc_edge, self.cols.items,
                        self.cols.split]
        if torch.compiler.is_compiling():
            return tensors
        return self._views.setdefault(transpose, GraphTensors(tensors))

    @classmethod
    def from_tensors(cls, tensors: list[Tensor], num_src: int,
                     chunk: int) -> TritonGraph:
        rowptr, col, row, items, split, *transpose = tensors
        csc_row = csc_edge = cols = None
        if transpose:
            csc_row, csc_edge, col_items, col_split = transpose
            cols = Schedule(col_items, col_split)
        return cls(rowptr, col, row, Schedule(items, split), num_src, chunk,
                   csc_row, csc_edge, cols)


def plain_index(name: str, index: Tensor) -> Tensor:
    """``index`` as a plain tensor the kernels can read: PyG's ``EdgeIndex``
    and ``Index`` hold their data in one (``as_tensor()``); any other tensor
    subclass that overrides ``__torch_dispatch__`` has no storage of its own
    (a GPU would read address 0x0) and is refused."""
    if type(index) is Tensor:
        return index
    as_tensor = getattr(index, 'as_tensor', None)
    if callable(as_tensor):
        index = as_tensor()
    if type(index).__torch_dispatch__ is not Tensor.__torch_dispatch__:
        raise TypeError(f'{name} is a {type(index).__name__}, a tensor subclass '
                        'whose data Triton cannot read; pass a plain torch.Tensor')
    return index.as_subclass(Tensor)


def check_graph(rowptr: Tensor, col: Tensor, num_src: int) -> None:
    """The invariants without which the kernels would read out of bounds:
    ``rowptr`` non-decreasing from 0 to ``E`` and every ``col`` in
    ``[0, N_src)``. On the CPU a violation raises at once (``IndexError``
    naming the index); on a GPU, and under :func:`torch.compile`, it is a
    device-side assert (no host sync)."""
    num_edges = col.numel()
    ok_ptr = ((rowptr[0] == 0) & (rowptr[-1] == num_edges)
              & (rowptr.diff() >= 0).all())
    low = high = ok_col = None
    if num_edges > 0:
        low, high = col.min(), col.max()
        ok_col = (low >= 0) & (high < num_src)
    if col.device.type != 'cpu' or torch.compiler.is_compiling():
        torch._assert_async(ok_ptr, 'rowptr must run non-decreasing from 0 to E')
        if ok_col is not None:
            torch._assert_async(ok_col, f'col must lie in [0, {num_src})')
        return
    if not ok_ptr:
        raise ValueError(f'rowptr must run non-decreasing from 0 to E = {num_edges}, '
                         f'got {rowptr.tolist()[:8]}...')
    if ok_col is not None and not ok_col:
        bad = int(low) if low < 0 else int(high)
        raise IndexError(f'col holds source index {bad}, outside [0, {num_src})')


def prepare_triton_graph(rowptr: Tensor, col: Tensor, num_src: int, *,
                         transpose: bool = True,
                         chunk: int | None = None) -> TritonGraph:
    r"""Check a destination-sorted CSR graph and build what the kernels read.

    Args:
        rowptr (torch.Tensor): ``[N_dst + 1]`` int32/int64 CSR row pointer
            (PyG's ``Index`` / ``EdgeIndex`` pass as their plain tensor).
        col (torch.Tensor): ``[E]`` source of every edge, in CSR order
            (duplicates, self-loops and unsorted columns within a row are fine).
        num_src (int): :math:`N_{src}`; every ``col`` must lie in
            ``[0, N_src)``.
        transpose (bool, optional): also build the transposed view that the
            deterministic backward needs for the key and value gradients.
            (default: :obj:`True`)
        chunk (int, optional): longest run of edges one program handles
            (default: ``ROW_CHUNK``).

    Raises:
        IndexError: a ``col`` outside ``[0, N_src)`` (CPU; a device-side
            assert on a GPU).
        ValueError: ``rowptr`` not non-decreasing from 0 to ``E``, or shapes.
        TypeError: integer dtypes, or a tensor subclass without storage.
    """
    rowptr, col = plain_index('rowptr', rowptr), plain_index('col', col)
    if rowptr.dtype not in (torch.int32, torch.int64) or col.dtype not in (
            torch.int32, torch.int64):
        raise TypeError(f'rowptr and col must be int32 or int64, got {rowptr.dtype} '
                        f'and {col.dtype}')
    if rowptr.dim() != 1 or rowptr.numel() == 0 or col.dim() != 1:
        raise ValueError(f'rowptr must be [N_dst + 1] and col [E], got '
                         f'{tuple(rowptr.shape)} and {tuple(col.shape)}')
    if rowptr.device != col.device:
        raise ValueError(f'rowptr is on {rowptr.device}, col on {col.device}')
    chunk = chunk or ROW_CHUNK
    num_edges = col.numel()
    rowptr = rowptr.long().contiguous()
    col = col.contiguous()
    check_graph(rowptr, col, num_src)
    row = segment_ids(rowptr, num_edges)
    rows = segment_schedule(rowptr, num_edges, chunk)
    csc_row = csc_edge = cols = None
    if transpose:
        csc_edge, colptr = sort_by_segment(col.long(), num_src)
        csc_row = row.index_select(0, csc_edge)
        cols = segment_schedule(colptr, num_edges, chunk)
    if not torch.compiler.is_compiling():  # one host read: the sizes in use
        schedules = [rows] if cols is None else [rows, cols]
        counts = torch.stack([n for s in schedules for n in s.used()]).tolist()
        rows = rows.trimmed(*counts[:2])
        cols = None if cols is None else cols.trimmed(*counts[2:])
    return TritonGraph(rowptr, col, row, rows, num_src, chunk, csc_row, csc_edge,
                       cols)
