"""One training loop for every task: progress bar, per-epoch metrics (JSON and
CSV), atomic best/last checkpoints, ``resume``, early stopping, LR schedules
and multi-process training (DDP under ``torchrun``)."""
from __future__ import annotations

import contextlib
import csv
import io
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from pyg_metric_attn.training.device import Placement
from pyg_metric_attn.training.distributed import DistributedContext
from pyg_metric_attn.training.eval_mode import eval_mode
from pyg_metric_attn.utils.denormals import denormals_flushed
from pyg_metric_attn.utils.io import (
    atomic_write_json,
    atomic_write_text,
    load_verified,
    save_verified,
)

StepFn = Callable[[torch.nn.Module, Any], Tensor]
EvaluateFn = Callable[[torch.nn.Module], dict[str, float]]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    r"""Fits ``model`` epoch by epoch.

    Each epoch runs ``step(model, batch)`` (returns the loss to minimise) on
    every batch of ``batches(epoch)``, then ``evaluate(model)`` (returns named
    metrics, computed under :func:`torch.no_grad` in eval mode). One row per
    epoch is kept in :attr:`history`: ``epoch``, ``train_loss``,
    ``epoch_seconds`` (training time), ``lr`` and the evaluation metrics.

    Args:
        model (torch.nn.Module): The model.
        optimizer (torch.optim.Optimizer): Its optimiser.
        step (callable): ``step(model, batch) -> loss``.
        evaluate (callable, optional): ``evaluate(model) -> {name: value}``.
        scheduler (optional): An LR scheduler, stepped once per epoch
            (``ReduceLROnPlateau`` is given the monitored metric).
        batch_scheduler (optional): An LR scheduler stepped after every
            optimiser step (e.g. a warm-up), alongside ``scheduler``.
        monitor (str or dict, optional): Metric that decides the best epoch.
            Or several, as ``{name: 'max' or 'min'}``: then an epoch is the
            best where each of them is at least as good as its best so far
            (ties count), and patience counts the epochs since any of them
            last reached its best (the rule of the GAT paper's code, with
            validation accuracy and loss).
        mode (str, optional): ``'max'`` or ``'min'`` for a single
            ``monitor``.
        patience (int, optional): Stop after this many epochs without a
            better ``monitor`` value.
        out_dir (str or Path, optional): Where ``metrics.json``,
            ``metrics.csv``, ``last.pt`` and ``best.pt`` are written
            (atomically, checksummed). Without it nothing is written.
        grad_clip (float, optional): Clip the gradient norm to this value.
        progress (bool, optional): Show a tqdm bar. (default: :obj:`True`)
        desc (str, optional): Progress bar label.
        checkpoint_extras (dict, optional): Extra entries stored in every
            checkpoint (e.g. the vocabulary a model needs to be used).
        distributed (DistributedContext, optional): This process's place
            among several training processes (see
            :func:`~pyg_metric_attn.training.distributed.process_group`).
            With several, ``step`` gets the model wrapped in
            :class:`~torch.nn.parallel.DistributedDataParallel` (gradients
            averaged over the ranks; ``batches(epoch)`` must give each rank
            its own share, with the same number of batches on every rank),
            ``train_loss`` is the mean over all ranks' batches, ``evaluate``
            runs on every rank and rank 0's metrics are kept (so every rank
            takes the same decisions), and only rank 0 writes files and shows
            the progress bar (give every rank the same ``out_dir``: saving
            gathers their random states); checkpoints hold every rank's
            random state and resume only with the same number of processes.
            One process (the default) trains as without it.
        placement (Placement, optional): The device and precision: the model
            is moved to its device, each batch too (tensors, PyG data, and
            tuples, lists and dicts of them), and ``step`` and ``evaluate``
            run under its autocast. ``evaluate`` finds its own data on the
            device. Without it nothing is moved and nothing autocast.
        flush_denormals (bool, optional): Run the epochs (``step``, its
            backward, the optimiser and ``evaluate``) with denormal floats
            (below 1.2e-38 in float32) flushed to zero on the calling CPU
            thread and torch's intra-op threads
            (:func:`~pyg_metric_attn.utils.denormals.denormals_flushed`);
            afterwards they get the caller's setting back. Weights and
            gradients that training drives towards zero pass through that
            range, where x86 CPUs compute many times slower: a
            MetricMeshFormer's CPU training steps ran 1.6-1.9x slower after 20
            epochs without the flush. GPU computations are not affected;
            ``PYG_METRIC_ATTN_FLUSH_DENORMALS=0`` switches the flush off
            everywhere. (default: :obj:`True`)
    """
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 step: StepFn, evaluate: EvaluateFn | None = None,
                 scheduler: Any = None,
                 monitor: str | Mapping[str, str] | None = None,
                 mode: str = 'max', patience: int | None = None,
                 out_dir: str | Path | None = None, grad_clip: float | None = None,
                 progress: bool = True, desc: str = 'train',
                 batch_scheduler: Any = None,
                 checkpoint_extras: dict[str, Any] | None = None,
                 distributed: DistributedContext | None = None,
                 placement: Placement | None = None,
                 flush_denormals: bool = True):
        modes = monitor.values() if isinstance(monitor, Mapping) else [mode]
        for value in modes:
            if value not in ('max', 'min'):
                raise ValueError(f"'mode' must be 'max' or 'min', got '{value}'")
        if isinstance(monitor, Mapping):
            if not monitor:
                raise ValueError("'monitor' names no metric")
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                raise ValueError("ReduceLROnPlateau follows one metric: give "
                                 "'monitor' as one metric name")
        if patience is not None and monitor is None:
            raise ValueError("'patience' needs a 'monitor' metric")
        self.placement = placement
        self.model = placement.move(model) if placement is not None else model
        self.distributed = distributed or DistributedContext()
        self.optimizer = optimizer
        self.step = step
        self.evaluate = evaluate
        self.scheduler = scheduler
        self.batch_scheduler = batch_scheduler
        self.checkpoint_extras = dict(checkpoint_extras or {})
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.grad_clip = grad_clip
        self.flush_denormals = flush_denormals
        self.progress = progress
        self.desc = desc
        self.history: list[dict[str, float]] = []
        self.best_epoch: int | None = None
        # Several monitored metrics: the last epoch where any reached its best.
        self._progress_epoch: int | None = None

    @property
    def best(self) -> dict[str, float] | None:
        """The history row of the best epoch (the last one without monitor)."""
        if self.best_epoch is None:
            return self.history[-1] if self.history else None
        return self.history[self.best_epoch - 1]

    def fit(self, batches: Callable[[int], Iterable[Any]], epochs: int,
            resume: bool = False,
            before_training: Callable[[], None] | None = None
            ) -> list[dict[str, float]]:
        """Train for up to ``epochs`` epochs (``batches(epoch)`` per epoch).

        With ``resume=True`` training goes on from :meth:`resume`;
        ``before_training`` is called once that resume is known to be valid,
        before the first epoch.
        """
        if resume:
            self.resume(epochs)
        if before_training is not None:
            before_training()
        bar = tqdm(range(len(self.history) + 1, epochs + 1), desc=self.desc,
                   disable=not (self.progress and self.distributed.is_main),
                   leave=False, dynamic_ncols=True)
        # What `step` runs: DDP around the model where there are several
        # ranks, for these epochs only (it holds the process group, which
        # must end with process_group's block: see there).
        training_model = self.distributed.wrap(self.model)
        with denormals_flushed(self.flush_denormals):
            for epoch in bar:
                row = self._train_epoch(training_model, batches(epoch), epoch)
                if self.evaluate is not None:
                    with eval_mode(self.model), self._autocast():
                        row.update(self.evaluate(self.model))
                row = self.distributed.broadcast_object(row)  # rank 0's
                self.history.append(row)
                improved = self._update_best(row)
                self._step_scheduler(row)
                self._save(improved)
                bar.set_postfix({k: f'{v:.4g}' for k, v in row.items()
                                 if k not in ('epoch', 'epoch_seconds', 'lr')})
                if self.patience is not None and self.best_epoch is not None \
                        and epoch - self._last_progress() >= self.patience:
                    break
        bar.close()
        return self.history

    def _train_epoch(self, training_model: torch.nn.Module,
                     batches: Iterable[Any], epoch: int) -> dict[str, float]:
        self.model.train()
        total, count = 0.0, 0
        start = time.perf_counter()
        for batch in batches:
            self.optimizer.zero_grad(set_to_none=True)
            if self.placement is not None:
                batch = self.placement.move(batch)
            with self._autocast():
                loss = self.step(training_model, batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"Training loss became {loss.item()} at epoch {epoch}")
            loss.backward()
            if self.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                               self.grad_clip)
            self.optimizer.step()
            if self.batch_scheduler is not None:
                self.batch_scheduler.step()
            total += float(loss.detach())
            count += 1
        if self.distributed.is_distributed:
            total, count = self.distributed.sum(
                torch.tensor([total, count], dtype=torch.float64)).tolist()
        return {'epoch': epoch, 'train_loss': total / max(count, 1),
                'epoch_seconds': time.perf_counter() - start,
                'lr': self.optimizer.param_groups[0]['lr']}

    def _autocast(self):
        return (self.placement.autocast() if self.placement is not None
                else contextlib.nullcontext())

    def _update_best(self, row: dict[str, float]) -> bool:
        if self.monitor is None:
            return False
        names = (list(self.monitor) if isinstance(self.monitor, Mapping)
                 else [self.monitor])
        for name in names:
            if name not in row:
                raise KeyError(f"Monitored metric '{name}' is not among the "
                               f"evaluation metrics {sorted(row)}")
        if isinstance(self.monitor, Mapping):
            reached = [_reached_best(self.history, name, mode)
                       for name, mode in self.monitor.items()]
            self._progress_epoch = max(
                (int(past['epoch']) for past, *flags
                 in zip(self.history, *reached, strict=True) if any(flags)),
                default=None)
            if not all(flags[-1] for flags in reached):
                return False
            self.best_epoch = int(row['epoch'])
            return True
        value = row[self.monitor]
        if self.best_epoch is not None:
            best = self.history[self.best_epoch - 1][self.monitor]
            better = value > best if self.mode == 'max' else value < best
            if not better or math.isnan(value):
                return False
        self.best_epoch = int(row['epoch'])
        return True

    def _last_progress(self) -> int:
        """The last epoch that improved the monitored metric (for several:
        where any of them reached its best so far, found by
        :meth:`_update_best`)."""
        if isinstance(self.monitor, Mapping):
            return self._progress_epoch
        return self.best_epoch

    def _step_scheduler(self, row: dict[str, float]) -> None:
        if self.scheduler is None:
            return
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            key = self.monitor or 'train_loss'
            self.scheduler.step(row[key])
        else:
            self.scheduler.step()

    def _state(self) -> dict[str, Any]:
        rng = self.distributed.gather_objects(_rng_state())
        return {
            **self.checkpoint_extras,
            'model': self.model.state_dict(),
            'optimizer': self.optimizer.state_dict(),
            'scheduler': (self.scheduler.state_dict()
                          if self.scheduler is not None else None),
            'batch_scheduler': (self.batch_scheduler.state_dict()
                                if self.batch_scheduler is not None else None),
            'history': self.history,
            'best_epoch': self.best_epoch,
            'rng': rng[0],
            # Every rank's, in rank order (several processes only).
            **({'rng_per_rank': rng} if self.distributed.is_distributed else {}),
        }

    def _save(self, improved: bool) -> None:
        if self.out_dir is None:
            return
        state = self._state()  # on every rank: it gathers their random states
        if not self.distributed.is_main:
            return
        atomic_write_json(self.out_dir / 'metrics.json', self.history)
        atomic_write_text(self.out_dir / 'metrics.csv', _to_csv(self.history))
        save_verified(state, self.out_dir / 'last.pt')
        if improved:
            save_verified({**self.checkpoint_extras, 'model': state['model'],
                           'epoch': self.best_epoch,
                           'metrics': self.best}, self.out_dir / 'best.pt')

    def resume(self, epochs: int) -> None:
        """Load the saved model, optimiser, scheduler, history and random
        states of ``out_dir/last.pt`` (where there is one), so that
        :meth:`fit` goes on from the epoch after the saved one. With several
        processes rank 0 reads the file and sends it to the others (which
        need not see rank 0's disk).

        Raises :class:`ValueError` before anything changes where the
        checkpoint does not fit the model, was written by another number of
        processes, or where ``epochs`` would run a cosine schedule past its
        end (its learning rate would rise again).
        """
        if self.out_dir is None:
            raise ValueError("'resume' needs an 'out_dir' with a checkpoint")
        path = self.out_dir / 'last.pt'
        state = self._read_checkpoint(path)
        if state is None:
            return
        per_rank = state.get('rng_per_rank')
        written_by = len(per_rank) if per_rank is not None else 1
        if written_by != self.distributed.world_size:
            raise ValueError(
                f"'{path}' was written by {written_by} training process(es) "
                f"and this run has {self.distributed.world_size}: resume with "
                f"{written_by} (each holds its own share of the data and "
                f"random state)")
        if isinstance(self.scheduler, torch.optim.lr_scheduler.CosineAnnealingLR):
            end = state['scheduler']['T_max']
            if epochs > end:
                raise ValueError(
                    f"'{path}': its cosine learning-rate schedule ends at epoch "
                    f"{end}; {epochs} epochs would run it past its end (the rate "
                    f"rises again). Resume with at most {end} epochs, or start "
                    f"a new run")
        try:
            self.model.load_state_dict(state['model'])
        except RuntimeError as error:
            raise ValueError(f"'{path}' does not fit the model (resume with the "
                             f"settings the run was trained with): "
                             f"{' '.join(str(error).split())}") from error
        self.optimizer.load_state_dict(state['optimizer'])
        if self.scheduler is not None and state['scheduler'] is not None:
            self.scheduler.load_state_dict(state['scheduler'])
        if self.batch_scheduler is not None and state.get('batch_scheduler'):
            self.batch_scheduler.load_state_dict(state['batch_scheduler'])
        self.history = state['history']
        self.best_epoch = state['best_epoch']
        _set_rng_state(per_rank[self.distributed.rank] if per_rank is not None
                       else state['rng'])

    def _read_checkpoint(self, path: Path) -> dict[str, Any] | None:
        """The checkpoint at ``path`` (None where there is none), read by rank
        0 and sent to every rank; an error reading it is raised on every rank."""
        if not self.distributed.is_distributed:
            return load_verified(path) if path.exists() else None
        state: Any = None
        if self.distributed.is_main:
            try:
                state = load_verified(path) if path.exists() else None
            except Exception as error:  # sent to the other ranks, then raised
                state = error
        state = self.distributed.broadcast_object(state)
        if isinstance(state, Exception):
            raise state
        return state


def best_checkpoint(out_dir: str | Path) -> Path:
    """The checkpoint of ``out_dir`` that holds its model: ``best.pt`` where
    a monitored metric chose an epoch, else ``last.pt`` (the last epoch)."""
    out_dir = Path(out_dir)
    for name in ('best.pt', 'last.pt'):
        if (out_dir / name).exists():
            return out_dir / name
    raise FileNotFoundError(f"No checkpoint (best.pt or last.pt) in '{out_dir}'")


def load_checkpoint(out_dir: str | Path) -> dict[str, Any]:
    """The checkpoint of ``out_dir`` that holds its model, read and verified
    (:func:`best_checkpoint`); its ``'epoch'`` is the epoch of that model."""
    state = load_verified(best_checkpoint(out_dir))
    state.setdefault('epoch', len(state.get('history', [])))
    return state


def load_best_model(model: torch.nn.Module, out_dir: str | Path) -> dict[str, Any]:
    """Load :func:`load_checkpoint` of ``out_dir`` into ``model``; returns
    the checkpoint."""
    state = load_checkpoint(out_dir)
    model.load_state_dict(state['model'])
    return state


def _rng_state() -> dict[str, Any]:
    """The random states of torch (CPU), Python and NumPy."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {'torch': torch.get_rng_state(), 'python': random.getstate(),
            'numpy': (name, keys.tolist(), int(pos), int(has_gauss),
                      float(cached))}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state['torch'])
    random.setstate(state['python'])
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos,
                         has_gauss, cached))


def _reached_best(history: list[dict[str, float]], name: str,
                  mode: str) -> list[bool]:
    """For each epoch of ``history``: whether its ``name`` was at least as
    good as every earlier epoch's (NaN never is)."""
    flags, best = [], None
    for row in history:
        value = row[name]
        flag = not math.isnan(value) and (
            best is None or (value >= best if mode == 'max' else value <= best))
        if flag:
            best = value
        flags.append(flag)
    return flags


def _to_csv(rows: list[dict[str, float]]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
