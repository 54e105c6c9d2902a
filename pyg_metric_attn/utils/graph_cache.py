r"""Structures derived from a graph, cached on the ``edge_index`` tensor they
come from.

Full-batch training calls every layer with the same ``edge_index`` tensor at
every step, yet each call would rebuild what depends only on the graph: the
index check, the graph with self-loops, the destination-sorted CSR view and
its transpose (single-threaded sorts: about a sixth of a fused step on CPU).
:func:`cached` builds such a structure once per ``edge_index`` *object* and
returns it again while that object lives unchanged:

* an entry is found by the tensor's identity and must still refer to that
  very tensor (a weak reference), so a new tensor that reuses a freed
  tensor's memory or ``id`` never sees another graph's structure;
* in-place writes to the tensor bump its version counter, which is part of
  the entry: a modified graph is rebuilt;
* an entry dies with its tensor (weak-reference callback) and at most
  ``CAPACITY`` entries are kept (least recently used first out), so
  mini-batches with a new ``edge_index`` each step hold no memory.

Nothing is cached for inference-mode tensors (they keep no version counter).

Under :func:`torch.compile` the cache is read, never written: an entry that
an eager call made for this very tensor is returned, and Dynamo takes its
tensors as inputs of the compiled graph (the lookup by the tensor's identity
is guarded, so another ``edge_index`` recompiles), so the graph holds none of
the structures' construction (self-loops dropped by ``nonzero``, sorts,
schedules) and ``mode='reduce-overhead'`` captures the step as one CUDA
graph (the builders mark their tensors static,
:func:`torch._dynamo.mark_static_address`, so that CUDA graphs read them
where they lie instead of copying them in at every replay). Without an
entry the graph builds the structure itself. Dynamo cannot read a version
counter, so an in-place change of ``edge_index`` between compiled calls goes
unseen there: give a changed graph a new tensor (eager calls see the
change).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch
from torch import Tensor

T = TypeVar('T')

#: Most entries kept (a few layers x a few graphs).
CAPACITY = 32

_entries: OrderedDict[tuple[int, Hashable],
                      tuple[weakref.ref, int, object]] = OrderedDict()


def cached(edge_index: Tensor, key: Hashable, build: Callable[[], T]) -> T:
    """``build()``, or what it returned for this unchanged ``edge_index`` and
    the same ``key`` (the parameters the structure depends on besides the
    graph, e.g. node counts and heads)."""
    ident = (id(edge_index), key)
    if torch.compiler.is_compiling():  # read only (module notes)
        entry = _entries.get(ident)
        if entry is not None and entry[0]() is edge_index:
            return entry[2]  # type: ignore[return-value]
        return build()
    if edge_index.is_inference():
        return build()
    entry = _entries.get(ident)
    if entry is not None:
        ref, version, value = entry
        if ref() is edge_index and version == edge_index._version:
            _entries.move_to_end(ident)
            return value  # type: ignore[return-value]
    value = build()
    ref = weakref.ref(edge_index, lambda _, ident=ident: _forget(ident))
    _entries[ident] = (ref, edge_index._version, value)
    _entries.move_to_end(ident)
    while len(_entries) > CAPACITY:
        _entries.popitem(last=False)
    return value


def _forget(ident: tuple[int, Hashable]) -> None:
    entry = _entries.get(ident)
    if entry is not None and entry[0]() is None:
        del _entries[ident]


def clear() -> None:
    """Drop every cached structure."""
    _entries.clear()
