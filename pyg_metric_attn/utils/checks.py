"""Input validation with error messages that name the problem.

The checks read tensor values (e.g. the largest index), which would break a
``torch.compile`` graph; layers call them only in eager mode. Reading a value
of a GPU tensor waits for the GPU, so on GPUs the index range is asserted on
the device (no host sync; a device-side assert when it fails) and read back
with a message naming the index only in PyG's debug mode
(``torch_geometric.debug()``).
"""
from __future__ import annotations

import torch
import torch_geometric
from torch import Tensor


def check_node_features(x: Tensor, name: str, channels: int) -> None:
    """``x`` must be a floating ``[num_nodes, channels]`` tensor (any width
    when ``channels`` is -1, i.e. lazily inferred)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"'{name}' must be a tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"'{name}' must have shape [num_nodes, {channels}], "
                         f"got shape {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"'{name}' must be a floating-point tensor, got {x.dtype}")
    if channels > 0 and x.size(1) != channels:
        raise ValueError(f"'{name}' has {x.size(1)} channels but the layer was "
                         f"built for {channels} (shape {list(x.shape)})")


def check_edge_index(edge_index: Tensor, num_src: int, num_dst: int,
                     read_values: bool | None = None) -> None:
    """``edge_index`` must be an integer ``[2, E]`` tensor with indices in
    range. With ``read_values`` (default: on CPU tensors, and on others in
    debug mode) an index out of range raises an :class:`IndexError` naming
    it; otherwise the device asserts the range without a host sync (a GPU
    reports a device-side assert, as PyG's own layers do)."""
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError("'edge_index' must have shape [2, num_edges], got "
                         f"shape {list(edge_index.shape)}")
    if edge_index.is_floating_point() or edge_index.is_complex() or \
            edge_index.dtype == torch.bool:
        raise TypeError(f"'edge_index' must hold integer indices, got "
                        f"{edge_index.dtype}")
    if edge_index.numel() == 0:
        return
    if read_values is None:
        read_values = (edge_index.device.type == 'cpu'
                       or torch_geometric.is_debug_enabled())
    if not read_values:
        in_range = ((edge_index.amin() >= 0)
                    & (edge_index[0].amax() < num_src)
                    & (edge_index[1].amax() < num_dst))
        torch._assert_async(in_range, f"'edge_index' holds an index out of "
                            f"range for {num_src} source and {num_dst} "
                            f"destination nodes")
        return
    if int(edge_index.min()) < 0:
        raise IndexError(f"'edge_index' contains a negative index "
                         f"({int(edge_index.min())})")
    for row, name, bound in ((0, 'source', num_src), (1, 'destination', num_dst)):
        largest = int(edge_index[row].max())
        if largest >= bound:
            raise IndexError(
                f"'edge_index' {name} index {largest} is out of range for "
                f"{bound} {name} nodes")


def check_edge_attr(edge_attr: Tensor, num_edges: int, edge_dim: int) -> None:
    """``edge_attr`` must be a floating ``[E]`` or ``[E, edge_dim]`` tensor."""
    if not edge_attr.is_floating_point():
        raise TypeError(f"'edge_attr' must be a floating-point tensor, got "
                        f"{edge_attr.dtype}")
    width = 1 if edge_attr.dim() == 1 else edge_attr.size(-1)
    if edge_attr.dim() > 2 or edge_attr.size(0) != num_edges or width != edge_dim:
        raise ValueError(f"'edge_attr' must have shape [{num_edges}, {edge_dim}] "
                         f"(one row per edge), got {list(edge_attr.shape)}")


def check_batch_vector(batch: Tensor, num_nodes: int) -> None:
    """``batch`` must be an integer ``[num_nodes]`` graph (or set) index per
    node, non-negative (checked on CPU tensors)."""
    if batch.dim() != 1 or batch.numel() != num_nodes:
        raise ValueError(f"'batch' must have shape [{num_nodes}] (one graph "
                         f"index per node), got {list(batch.shape)}")
    if batch.is_floating_point() or batch.is_complex() or \
            batch.dtype == torch.bool:
        raise TypeError(f"'batch' must hold integer graph indices, got "
                        f"{batch.dtype}")
    if batch.numel() and batch.device.type == 'cpu' and int(batch.min()) < 0:
        raise IndexError(f"'batch' contains a negative graph index "
                         f"({int(batch.min())})")
