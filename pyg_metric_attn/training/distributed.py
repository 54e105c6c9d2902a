r"""Multi-process training with PyTorch's own engine: ``torchrun`` starts the
processes, :class:`~torch.nn.parallel.DistributedDataParallel` averages the
gradients.

:func:`process_group` reads what ``torchrun`` (or any launcher of the
``env://`` protocol) puts in the environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and joins the group with a
timeout, so that a rank that dies or hangs ends the others with
:class:`CollectiveError` instead of a wait without end. Without those
variables it yields a one-process :class:`DistributedContext` and starts
nothing, so the same code runs alone.

:func:`shard_indices` gives each rank its share of the training items for an
epoch (the split of :class:`~torch.utils.data.DistributedSampler`);
:class:`~pyg_metric_attn.training.Trainer` takes the context and then wraps the
model in DDP, reduces the training loss over the ranks, keeps rank 0's
evaluation and writes its checkpoints from rank 0 only (with every rank's
random state, so that ``resume`` goes on exactly).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DistributedSampler

#: Seconds a collective waits for the other ranks before it fails (torch's own
#: default; ``PYG_METRIC_ATTN_DIST_TIMEOUT`` overrides it).
DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_VARIABLE = 'PYG_METRIC_ATTN_DIST_TIMEOUT'
# Where the communication backends name themselves in their error messages
# (gloo's transport errors are plain RuntimeErrors).
_BACKEND_MARKERS = ('gloo', 'nccl', 'c10d', 'processgroup')


class CollectiveError(RuntimeError):
    """A collective operation failed: another rank died or stopped answering
    within the timeout."""


@dataclass(frozen=True)
class DistributedContext:
    """Where this process stands among the training processes.

    The default is the one-process context: collectives are identities and
    :meth:`wrap` returns the model itself.

    Args:
        rank (int, optional): This process's rank. (default: :obj:`0`)
        world_size (int, optional): Number of processes. (default: :obj:`1`)
        local_rank (int, optional): Rank on this machine (its GPU).
            (default: :obj:`0`)
        device (torch.device, optional): This process's device.
            (default: CPU)
        timeout_s (float, optional): The collectives' timeout in seconds.
    """
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device('cpu'))
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size "
                             f"{self.world_size}")

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (evaluates, logs, writes checkpoints)."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """Whether there are several processes."""
        return self.world_size > 1

    def rank_seed(self, seed: int) -> int:
        """A seed of its own for this rank (``seed`` where there is one
        process), e.g. so that ranks draw different augmentations."""
        return seed * self.world_size + self.rank

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def sum(self, values: Tensor) -> Tensor:
        """``values`` summed over the ranks (a new tensor on the device of
        ``values``; ``values`` itself where there is one process). The sum
        runs on this rank's :attr:`device` (NCCL reduces CUDA tensors only)."""
        if not self.is_distributed:
            return values
        total = values.detach().to(self.device, copy=True)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.to(values.device)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.is_distributed:
            return [obj]
        objects: list[Any] = [None] * self.world_size
        dist.all_gather_object(objects, obj)
        return objects

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (the others' ``obj`` is ignored)."""
        if not self.is_distributed:
            return obj
        holder = [obj if self.is_main else None]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    @contextmanager
    def main_first(self) -> Iterator[None]:
        """Run the block on rank 0 first, then on the others (e.g. to
        prepare and cache data once, which the others then read)."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` in :class:`~torch.nn.parallel.DistributedDataParallel`
        where there are several processes (its parameters must be on
        :attr:`device`); the model itself otherwise.

        Free the wrapper inside the :func:`process_group` block (keep it in a
        local of the training function, as
        :meth:`~pyg_metric_attn.training.Trainer.fit` does): it holds the
        process group, and a group freed after the block can hang the
        process."""
        if not self.is_distributed:
            return model
        devices = {p.device for p in model.parameters()}
        if devices - {self.device}:
            raise ValueError(f"Move the model to this rank's device "
                             f"{self.device} before wrapping it (its parameters "
                             f"are on {sorted(map(str, devices))})")
        device_ids = [self.device.index] if self.device.type == 'cuda' else None
        return torch.nn.parallel.DistributedDataParallel(model,
                                                         device_ids=device_ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a :class:`~torch.nn.parallel.DistributedDataParallel`
    (the model itself otherwise)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


def shard_indices(num_items: int, context: DistributedContext, seed: int,
                  epoch: int, shuffle: bool = True) -> Tensor:
    r"""This rank's indices into ``num_items`` items for ``epoch``: the
    split of :class:`~torch.utils.data.DistributedSampler` (one permutation
    seeded by ``seed + epoch`` on every rank, padded by repeating its start to
    a multiple of the world size, then every ``world_size``-th item from
    ``rank``). Every rank gets the same number of items, so each takes the
    same number of optimiser steps (DDP needs that), and the ranks' shares
    together cover every item (up to ``world_size - 1`` twice).

    Shapes:
        - **output:** :math:`(\lceil n / W \rceil)` indices
    """
    if num_items < 1:
        raise ValueError(f"Nothing to share among {context.world_size} ranks "
                         f"(num_items={num_items})")
    sampler = DistributedSampler(range(num_items),
                                 num_replicas=context.world_size,
                                 rank=context.rank, shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return torch.tensor(list(sampler), dtype=torch.long)


def strided_share(num_items: int, context: DistributedContext) -> range:
    """Indices ``rank, rank + W, ...`` of ``num_items``: a split for
    evaluation, without the padding of :func:`shard_indices` (so that each
    item counts once; shares differ in size by at most one)."""
    return range(context.rank, num_items, context.world_size)


@contextmanager
def process_group(timeout_s: float | None = None, backend: str | None = None
                  ) -> Iterator[DistributedContext]:
    r"""Join the process group that ``torchrun`` set up in the environment;
    yields this process's :class:`DistributedContext`.

    ``backend`` (default: ``'nccl'`` where CUDA is available, each rank on
    GPU ``LOCAL_RANK``, else ``'gloo'`` on the CPU) decides the device.
    Without ``WORLD_SIZE`` (a plain ``python script.py``), or with
    ``WORLD_SIZE=1``, nothing is started and the one-process context comes
    back. Otherwise the group is joined with ``backend`` and ``timeout_s``
    (default: ``$PYG_METRIC_ATTN_DIST_TIMEOUT`` or :data:`DEFAULT_TIMEOUT_S`)
    for the rendezvous and every collective. A collective that fails inside the
    ``with`` block (a rank died: at once; a rank hangs: after the timeout)
    is raised as :class:`CollectiveError` naming this rank; the group is
    left on leaving the block.
    """
    if timeout_s is None:
        timeout_s = float(os.environ.get(TIMEOUT_VARIABLE, DEFAULT_TIMEOUT_S))
    if timeout_s <= 0:
        raise ValueError(f"The timeout must be positive, got {timeout_s} s")
    world_size = int(os.environ.get('WORLD_SIZE', '1'))
    local_rank = int(os.environ.get('LOCAL_RANK', '0'))
    if backend is None:
        backend = 'nccl' if torch.cuda.is_available() else 'gloo'
    device = (torch.device('cuda', local_rank) if backend == 'nccl'
              else torch.device('cpu'))
    if world_size <= 1:
        yield DistributedContext(device=device, timeout_s=timeout_s)
        return
    missing = [name for name in ('RANK', 'MASTER_ADDR', 'MASTER_PORT')
               if name not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={world_size} but {', '.join(missing)} "
                           f"unset: start the processes with torchrun (e.g. "
                           f"torchrun --nproc_per_node={world_size} ...)")
    rank = int(os.environ['RANK'])
    if device.type == 'cuda':
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    context = DistributedContext(rank, world_size, local_rank, device, timeout_s)
    try:
        yield context
    except RuntimeError as error:
        if isinstance(error, CollectiveError) or not _is_collective_failure(error):
            raise
        raise CollectiveError(
            f"rank {rank} of {world_size}: a collective operation failed: "
            f"another rank has died or has not answered within the "
            f"{timeout_s:g} s timeout ({_first_line(error)}). Start all ranks "
            f"again; the last checkpoint resumes the run") from error
    # Leave the group only after a clean end: after a failure the others may
    # be gone, and the process exits anyway. Ranks leave together, and the
    # group ends here, in destroy_process_group. A holder that outlived the
    # block (a DDP wrapper's reducer) would free it later, from a destructor
    # that holds the GIL while it waits for gloo's threads to end, and they
    # may need the GIL to free their last collective's tensors: rank 0 hung
    # after its last line in 1 run of about 30 of the torchrun test.
    dist.barrier()
    dist.destroy_process_group()


def _is_collective_failure(error: BaseException) -> bool:
    if isinstance(error, dist.DistError):
        return True
    message = str(error).lower()
    return any(marker in message for marker in _BACKEND_MARKERS)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
