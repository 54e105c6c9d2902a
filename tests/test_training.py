"""Trainer: resume equals an uninterrupted run, checkpoints are verified,
early stopping, and the atomic/verified file helpers."""
from __future__ import annotations

import json
import os
import stat

import pytest
import torch
import torch.nn.functional as F

from pyg_metric_attn.training import (
    Trainer,
    WarmupCosine,
    epoch_generator,
    eval_mode,
    load_best_model,
    seed_everything,
    warmup_cosine,
)
from pyg_metric_attn.utils.io import (
    CorruptFileError,
    atomic_write_json,
    atomic_write_text,
    load_verified,
    save_verified,
)


def make_trainer(out_dir=None, **kwargs):
    seed_everything(0)
    x = torch.randn(64, 3)
    y = (x.sum(1) > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def batches(epoch):
        for index in torch.randperm(64).split(16):  # global RNG: must resume
            yield x[index], y[index]

    def step(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    def evaluate(model):
        return {'acc': float((model(x).argmax(1) == y).float().mean())}

    kwargs.setdefault('monitor', 'acc')
    trainer = Trainer(model, optimizer, step, evaluate, out_dir=out_dir,
                      progress=False, **kwargs)
    return trainer, batches


def test_resume_equals_uninterrupted(tmp_path):
    trainer, batches = make_trainer()
    full = trainer.fit(batches, 6)
    expected = [p.detach().clone() for p in trainer.model.parameters()]

    first, batches = make_trainer(tmp_path)
    first.fit(batches, 3)
    resumed, batches = make_trainer(tmp_path)
    torch.manual_seed(999)  # the saved RNG state must win over this
    history = resumed.fit(batches, 6, resume=True)
    drop = ('epoch_seconds',)
    assert [{k: v for k, v in r.items() if k not in drop} for r in history] == \
        [{k: v for k, v in r.items() if k not in drop} for r in full]
    for a, b in zip(resumed.model.parameters(), expected, strict=True):
        assert torch.equal(a, b)
    rows = json.loads((tmp_path / 'metrics.json').read_text())
    assert [r['epoch'] for r in rows] == list(range(1, 7))
    assert (tmp_path / 'metrics.csv').read_text().startswith('epoch,train_loss')


def test_best_checkpoint_and_loading(tmp_path):
    trainer, batches = make_trainer(tmp_path)
    trainer.fit(batches, 5)
    state = load_best_model(trainer.model, tmp_path)
    assert state['epoch'] == trainer.best_epoch
    assert state['metrics']['acc'] == max(r['acc'] for r in trainer.history)


def test_corrupt_checkpoint_is_detected(tmp_path):
    trainer, batches = make_trainer(tmp_path)
    trainer.fit(batches, 2)
    path = tmp_path / 'last.pt'
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match='checksum'):
        make_trainer(tmp_path)[0].fit(batches, 3, resume=True)
    path.write_bytes(bytes(data[:100]))
    with pytest.raises(CorruptFileError):
        load_verified(path)
    (tmp_path / 'other.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(CorruptFileError, match='not a verified'):
        load_verified(tmp_path / 'other.pt')


def test_batch_scheduler_and_checkpoint_extras_resume(tmp_path):
    """A per-batch schedule steps once per optimiser step and resumes with the
    run; extra entries land in both checkpoints."""
    def make(out_dir=None):
        trainer, batches = make_trainer(out_dir)
        trainer.batch_scheduler = warmup_cosine(trainer.optimizer, 3, 16)
        trainer.checkpoint_extras = {'vocabulary': ['<pad>', 'a']}
        return trainer, batches

    trainer, batches = make()
    full = trainer.fit(batches, 4)  # 4 batches per epoch: 16 steps
    schedule = WarmupCosine(3, 16)
    assert [row['lr'] for row in full] == \
        pytest.approx([1e-2 * schedule(4 * epoch) for epoch in (1, 2, 3, 4)])
    first, batches = make(tmp_path)
    first.fit(batches, 2)
    resumed, batches = make(tmp_path)
    history = resumed.fit(batches, 4, resume=True)
    assert [r['lr'] for r in history] == [r['lr'] for r in full]
    for a, b in zip(resumed.model.parameters(), trainer.model.parameters(),
                    strict=True):
        assert torch.equal(a, b)
    for name in ('best.pt', 'last.pt'):
        assert load_verified(tmp_path / name)['vocabulary'] == ['<pad>', 'a']


def test_early_stopping_and_errors():
    trainer, batches = make_trainer(patience=2)
    trainer.evaluate = lambda model: {'acc': 0.5}  # never improves after epoch 1
    history = trainer.fit(batches, 50)
    assert len(history) == 3 and trainer.best_epoch == 1
    with pytest.raises(ValueError, match='monitor'):
        Trainer(torch.nn.Linear(1, 1), None, None, patience=3)
    trainer, batches = make_trainer()
    trainer.step = lambda model, batch: torch.tensor(float('nan'),
                                                     requires_grad=True)
    with pytest.raises(FloatingPointError, match='epoch 1'):
        trainer.fit(batches, 1)


def test_several_monitors_follow_the_gat_papers_rule(tmp_path):
    """Best: every monitored metric at least as good as ever (ties count);
    patience: epochs since any of them last reached its best. Resumes."""
    scores = [(0.5, 1.0), (0.6, 1.1), (0.6, 0.9), (0.55, 0.95), (0.55, 0.85),
              (0.5, 1.0), (0.5, 1.0), (0.7, 0.5)]

    def make(out_dir=None):
        trainer, batches = make_trainer(out_dir, patience=2)
        trainer.monitor = {'acc': 'max', 'loss': 'min'}
        epoch = lambda: len(trainer.history)  # noqa: E731 (0-based, evaluating)
        trainer.evaluate = lambda model: dict(zip(('acc', 'loss'),
                                                  scores[epoch()], strict=True))
        return trainer, batches

    trainer, batches = make()
    history = trainer.fit(batches, 50)
    # Epoch 3 ties the best accuracy at the best loss; epoch 5's loss is a new
    # best (progress, not a best epoch); epochs 6-7 improve neither: stop.
    assert len(history) == 7 and trainer.best_epoch == 3
    first, batches = make(tmp_path)
    first.fit(batches, 4)
    resumed, batches = make(tmp_path)
    assert len(resumed.fit(batches, 50, resume=True)) == 7
    assert resumed.best_epoch == 3
    assert load_verified(tmp_path / 'best.pt')['epoch'] == 3
    with pytest.raises(ValueError, match="'max' or 'min', got 'up'"):
        Trainer(torch.nn.Linear(1, 1), None, None, monitor={'acc': 'up'})
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match='one metric'):
        Trainer(torch.nn.Linear(1, 1), optimizer, None,
                scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer),
                monitor={'acc': 'max', 'loss': 'min'})


def test_reduce_lr_on_plateau_reads_the_monitored_metric_and_resumes(tmp_path):
    """A ReduceLROnPlateau scheduler steps once per epoch on the monitored
    metric (here accuracy, mode max, patience 1): the learning rate halves
    after two epochs without a better value, and a resumed run keeps the
    scheduler's state."""
    scores = [0.5, 0.6, 0.6, 0.6, 0.6, 0.7, 0.7, 0.7, 0.7]

    def make(out_dir=None):
        trainer, batches = make_trainer(out_dir)
        trainer.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            trainer.optimizer, mode='max', factor=0.5, patience=1)
        trainer.evaluate = lambda model: {'acc': scores[len(trainer.history)]}
        return trainer, batches

    trainer, batches = make()
    lrs = [row['lr'] for row in trainer.fit(batches, 9)]
    assert lrs == [1e-2] * 4 + [5e-3] * 4 + [2.5e-3]
    first, batches = make(tmp_path)
    first.fit(batches, 3)  # one epoch without progress counted
    resumed, batches = make(tmp_path)
    assert [row['lr'] for row in resumed.fit(batches, 9, resume=True)] == lrs
    # Without a monitor it reads the training loss (mode min).
    trainer, batches = make_trainer(monitor=None)
    seen = []
    trainer.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        trainer.optimizer)
    trainer.scheduler.step = seen.append
    history = trainer.fit(batches, 3)
    assert seen == [row['train_loss'] for row in history]


def test_atomic_and_verified_writes(tmp_path):
    atomic_write_json(tmp_path / 'a' / 'b.json', {'x': 1})
    assert json.loads((tmp_path / 'a' / 'b.json').read_text()) == {'x': 1}
    save_verified({'t': torch.arange(3)}, tmp_path / 'c.pt')
    assert torch.equal(load_verified(tmp_path / 'c.pt')['t'], torch.arange(3))
    assert sorted(p.name for p in tmp_path.rglob('*')) == ['a', 'b.json', 'c.pt']


def test_atomic_writes_keep_the_umask(tmp_path):
    umask = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / 'a.txt', 'text')
        save_verified({'x': 1}, tmp_path / 'b.pt')
        plain = tmp_path / 'c.txt'
        plain.write_text('text')
    finally:
        os.umask(umask)
    for name in ('a.txt', 'b.pt', 'c.txt'):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name


@pytest.mark.parametrize('training', [True, False])
def test_eval_mode_restores_the_mode_also_after_an_error(training):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    model.train(training)
    with eval_mode(model) as inside:
        assert inside is model and not model.training and not model[1].training
        assert not torch.is_grad_enabled()
    assert model.training == training and model[1].training == training
    with pytest.raises(RuntimeError, match='boom'), eval_mode(model):
        raise RuntimeError('boom')
    assert model.training == training and torch.is_grad_enabled()


def test_epoch_generator_is_one_stream_per_seed_and_epoch():
    def draw(seed, epoch):
        return torch.randperm(50, generator=epoch_generator(seed, epoch))
    assert torch.equal(draw(3, 7), draw(3, 7))
    assert not torch.equal(draw(3, 7), draw(3, 8))
    assert not torch.equal(draw(3, 7), draw(4, 7))
    # The streams of the runs in RESULTS.md: seed * 1_000_003 + epoch.
    expected = torch.randperm(50, generator=torch.Generator().manual_seed(
        2 * 1_000_003 + 5))
    assert torch.equal(draw(2, 5), expected)


def flushed_on_every_thread(tiny: torch.Tensor) -> bool:
    """Whether ``tiny * 1e-19`` (denormal, 1e-39) came out as zero on every
    intra-op thread's share of ``tiny``."""
    return bool(torch.all(tiny * 1e-19 == 0))


@pytest.mark.parametrize('flush', [True, False])
def test_trainer_flushes_denormals_in_steps_backward_and_evaluation(two_threads,
                                                                    flush):
    """Weights and gradients that decay towards zero pass through the denormal
    range, where x86 CPUs are many times slower; the epochs run with them
    flushed (by default) and the caller's setting comes back after fit."""
    tiny = torch.full((1 << 20,), 1e-20)  # both threads compute half of it
    seen = {}
    model = torch.nn.Linear(1, 1)

    def record(name):
        seen[name] = flushed_on_every_thread(tiny)

    def step(model, batch):
        record('step')
        out = model(batch)
        out.register_hook(lambda grad: record('backward'))
        return out.sum()

    def evaluate(model):
        record('evaluate')
        return {}

    kwargs = {} if flush else {'flush_denormals': False}
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), step, evaluate,
            progress=False, **kwargs).fit(lambda epoch: [torch.ones(2, 1)], 2)
    assert seen == {'step': flush, 'backward': flush, 'evaluate': flush}
    assert not flushed_on_every_thread(tiny)
