"""Multi-process training: examples/distributed_node_classification.py in two
gloo processes against one process on the union of the ranks' batches; a hung
and then killed rank; resuming from rank 0's checkpoint; the library's pieces
in one process. (``torchrun`` itself launches the mesh trainer in
tests/test_mesh_training.py.)"""
from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.typing

from pyg_metric_attn.training import (
    DistributedContext,
    Trainer,
    process_group,
    shard_indices,
    strided_share,
)
from pyg_metric_attn.utils.io import load_verified, save_verified

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / 'examples' / 'distributed_node_classification.py'
# 600 training nodes, 300 per rank: 10 steps of 32 seeds per rank and epoch,
# every neighbour (so that a rank's batch sees what the full graph shows).
ARGS = ['--nodes', '1200', '--hidden', '4', '--heads', '2', '--batch-size', '32',
        '--num-neighbors', '-1', '-1', '--no-progress', '--threads', '1']
EPOCHS = 2
# What the fork server imports once, so that each rank starts in a fraction of
# a second instead of ~6 s of imports (two cores: CI time).
PRELOAD = ['torch', 'torch_geometric', 'torch_geometric.loader',
           'pyg_metric_attn', 'pyg_metric_attn.datasets', 'pyg_metric_attn.training']

needs_sampler = pytest.mark.skipif(
    not (torch_geometric.typing.WITH_PYG_LIB
         or torch_geometric.typing.WITH_TORCH_SPARSE),
    reason="NeighborLoader needs the [sampling] extra (torch-sparse)")


def load_script():
    spec = importlib.util.spec_from_file_location('distributed_node_classification',
                                                  SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def set_torchrun_variables(rank: int, port: int) -> None:
    """The variables torchrun sets for ``rank`` of two on this machine."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE='2',
                      LOCAL_WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port))


def run_rank(rank: int, port: int, argv: list[str], log: str) -> None:
    """One rank of the script with the variables torchrun sets (its output in
    ``log``); exits with the script's code."""
    set_torchrun_variables(rank, port)
    with open(log, 'w') as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    sys.exit(load_script().main(argv))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start_ranks(target, args_of_rank=lambda rank: ()
                ) -> list[multiprocessing.Process]:
    """Two processes of the fork server running ``target(rank, port,
    *args_of_rank(rank))``, started as torchrun starts ranks but without its
    agent (which would end the others itself when one dies)."""
    context = multiprocessing.get_context('forkserver')
    context.set_forkserver_preload(PRELOAD)  # before the server starts
    port = free_port()
    processes = [context.Process(target=target,
                                 args=(rank, port, *args_of_rank(rank)))
                 for rank in range(2)]
    for process in processes:
        process.start()
    return processes


def end_ranks(processes: list[multiprocessing.Process]) -> None:
    for process in processes:
        if process.exitcode is None:
            process.kill()  # SIGKILL ends a stopped process too
        process.join()


class Ranks:
    """Two ranks of the script (:func:`start_ranks`)."""
    def __init__(self, out: Path, *extra: str):
        self.logs = [out.parent / f'{out.name}-rank{rank}.log' for rank in range(2)]
        argv = [*ARGS, '--out', str(out), *extra]
        self.processes = start_ranks(
            run_rank, lambda rank: (argv, str(self.logs[rank])))

    def log(self, rank: int) -> str:
        return self.logs[rank].read_text()

    def wait(self, timeout: float = 120) -> None:
        """Until both end; each must succeed."""
        for rank, process in enumerate(self.processes):
            process.join(timeout)
            assert process.exitcode == 0, self.log(rank)

    def wait_for(self, path: Path, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            for rank, process in enumerate(self.processes):
                if process.exitcode is not None:
                    pytest.fail(f'rank {rank} ended before {path.name} was '
                                f'written:\n{self.log(rank)}')
            assert time.monotonic() < deadline, f'no {path} after {timeout} s'
            time.sleep(0.01)

    def end(self) -> None:
        end_ranks(self.processes)


def model_state(run: Path) -> dict[str, torch.Tensor]:
    return load_verified(run / 'last.pt')['model']


@pytest.fixture(scope='module')
def two_process_run(tmp_path_factory) -> Path:
    """Two epochs of the script in two processes."""
    out = tmp_path_factory.mktemp('ddp') / 'run'
    Ranks(out, '--epochs', str(EPOCHS)).wait()
    return out


@needs_sampler
def test_ddp_steps_equal_one_process_on_the_union_of_the_ranks_batches(
        two_process_run, one_thread):
    script = load_script()
    args = script.parse_args([*ARGS, '--epochs', str(EPOCHS)])
    data = script.make_data(args)
    model = script.build_model(args, data)
    optimizer = script.make_optimizer(args, model)
    train_nodes = data.train_mask.nonzero().view(-1)
    steps, epoch_losses = 0, []
    for epoch in range(1, EPOCHS + 1):
        losses = []
        shares = [train_nodes[shard_indices(len(train_nodes),
                                            DistributedContext(rank, 2),
                                            args.seed, epoch)]
                  for rank in range(2)]
        for start in range(0, len(shares[0]), args.batch_size):
            union = torch.cat([share[start:start + args.batch_size]
                               for share in shares])
            optimizer.zero_grad()
            out = model(data.x, data.edge_index)[union]
            loss = F.cross_entropy(out, data.y[union])
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
            steps += 1
        epoch_losses.append(sum(losses) / len(losses))
    assert steps == 20
    # The logged loss is the mean over both ranks' batches.
    history = load_verified(two_process_run / 'last.pt')['history']
    assert [row['train_loss'] for row in history] == pytest.approx(epoch_losses,
                                                                  rel=1e-5)
    ddp = model_state(two_process_run)
    initial = script.build_model(args, data).state_dict()
    # The output bias b2 of the tied map phi cancels in phi(x_i) - phi(x_j):
    # its gradient is rounding noise, which Adam scales up to steps of size
    # lr, so it wanders differently in each run without changing any output.
    noise_only = {name for name in ddp if name.endswith('embed_src.out.bias')}
    assert len(noise_only) == 2
    for name, value in model.state_dict().items():
        assert not torch.allclose(ddp[name], initial[name])  # it trained
        if name not in noise_only:
            torch.testing.assert_close(ddp[name], value, atol=1e-5, rtol=1e-5,
                                       msg=name)
    with torch.no_grad():
        expected = model(data.x, data.edge_index)
        model.load_state_dict(ddp)
        torch.testing.assert_close(model(data.x, data.edge_index), expected,
                                   atol=1e-5, rtol=1e-5)


@needs_sampler
def test_a_hung_rank_ends_the_other_with_an_error_and_the_run_resumes(tmp_path):
    """Rank 0 stops answering after epoch 1 (SIGSTOP): rank 1 exits after the
    3 s timeout with one clear line; rank 0 is then killed, and the run
    started again with --resume from rank 0's checkpoint ends where an
    uninterrupted run does, sampled neighbours and all (each rank's random
    state is restored). (A rank that dies closes its connections: the others
    fail at once, through the same error.)"""
    sampled = ['--num-neighbors', '3', '3', '--epochs', str(EPOCHS)]
    straight = tmp_path / 'straight'
    Ranks(straight, *sampled).wait()
    out = tmp_path / 'run'
    ranks = Ranks(out, *sampled, '--timeout', '3')
    try:
        ranks.wait_for(out / 'last.pt')  # epoch 1 is done
        os.kill(ranks.processes[0].pid, signal.SIGSTOP)
        start = time.monotonic()
        ranks.processes[1].join(60)
        waited = time.monotonic() - start
    finally:
        ranks.end()
    stderr = ranks.log(1)
    assert ranks.processes[1].exitcode == 1, stderr
    assert ('error: rank 1 of 2: a collective operation failed: another rank '
            'has died or has not answered within the 3 s timeout') in stderr
    assert 'Traceback' not in stderr
    assert waited < 30
    history = load_verified(out / 'last.pt')['history']
    assert [row['epoch'] for row in history] == [1], \
        'the run went past epoch 1 before rank 0 stopped; make epochs longer'

    Ranks(out, *sampled, '--resume').wait()
    resumed = model_state(out)
    for name, value in model_state(straight).items():
        torch.testing.assert_close(resumed[name], value, atol=1e-6, rtol=1e-6,
                                   msg=name)
    rows = load_verified(out / 'last.pt')['history']
    assert [row['epoch'] for row in rows] == [1, 2]


def gloo_threads() -> list[str]:
    """The worker threads of this process's gloo process groups."""
    tasks = Path('/proc/self/task')
    return [name for name in ((task / 'comm').read_text().strip()
                              for task in tasks.iterdir())
            if name == 'pt_gloo_runloop']


def fit_in_a_group_then_count_gloo_threads(rank: int, port: int) -> None:
    """One rank: a Trainer's two epochs inside ``process_group``; exits with
    the number of gloo worker threads left running after the block, or 99
    where none ran inside it (at once, without the interpreter's teardown,
    where a group that outlived its block may hang)."""
    set_torchrun_variables(rank, port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with process_group(timeout_s=60) as context:
        model = torch.nn.Linear(2, 1)
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          lambda m, x: m(x).square().mean(), progress=False,
                          distributed=context)
        trainer.fit(lambda epoch: [torch.ones(4, 2)], epochs=2)
        running = len(gloo_threads())
    os._exit(len(gloo_threads()) if running else 99)


@pytest.mark.skipif(not Path('/proc/self/task').is_dir(),
                    reason='reads the threads from /proc (Linux)')
def test_leaving_the_group_after_training_ends_its_threads():
    """When the ``process_group`` block ends, so has the group: nothing the
    Trainer made (DDP's reducer) holds it on. A group freed later, by a
    destructor that holds the GIL while gloo's ending threads wait for the
    GIL, hung rank 0 after its last line (1 run in about 30 of the torchrun
    test on two busy cores)."""
    ranks = start_ranks(fit_in_a_group_then_count_gloo_threads)
    for rank in ranks:
        rank.join(120)
    end_ranks(ranks)
    assert [rank.exitcode for rank in ranks] == [0, 0]


# The library's pieces in one process ------------------------------------------

def test_shards_cover_every_item_with_equal_shares():
    for num_items, world in ((10, 2), (11, 3), (2, 4)):
        shares = [shard_indices(num_items, DistributedContext(rank, world), 0, 1)
                  for rank in range(world)]
        assert len({len(share) for share in shares}) == 1
        assert set(torch.cat(shares).tolist()) == set(range(num_items))
        assert sum(len(share) for share in shares) - num_items < world
    context = DistributedContext(0, 2)
    assert not torch.equal(shard_indices(100, context, 0, 1),
                           shard_indices(100, context, 0, 2))  # new each epoch
    assert torch.equal(shard_indices(100, context, 0, 1),
                       shard_indices(100, context, 0, 1))
    assert list(strided_share(5, DistributedContext(1, 2))) == [1, 3]
    with pytest.raises(ValueError, match='rank 2 is outside world size 2'):
        DistributedContext(2, 2)


def test_one_process_without_torchrun_starts_nothing(monkeypatch):
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    monkeypatch.setenv('PYG_METRIC_ATTN_DIST_TIMEOUT', '42')
    with process_group(backend='gloo') as context:
        assert context == DistributedContext(timeout_s=42.0)
        assert not torch.distributed.is_initialized()
        value = torch.tensor([1.0, 2.0])
        assert context.sum(value) is value
        assert context.gather_objects('a') == ['a']
        model = torch.nn.Linear(2, 2)
        assert context.wrap(model) is model
    monkeypatch.setenv('WORLD_SIZE', '2')
    monkeypatch.delenv('MASTER_ADDR', raising=False)
    with pytest.raises(RuntimeError, match='torchrun --nproc_per_node=2'):
        with process_group():
            pass


def test_a_checkpoint_resumes_only_with_as_many_processes(tmp_path):
    model = torch.nn.Linear(2, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                      lambda m, b: m(b).sum(), out_dir=tmp_path, progress=False)
    trainer.fit(lambda epoch: [torch.randn(3, 2)], epochs=1)
    state = load_verified(tmp_path / 'last.pt')
    assert 'rng_per_rank' not in state  # one process: as before
    state['rng_per_rank'] = [state['rng']] * 2  # as two processes write it
    save_verified(state, tmp_path / 'last.pt')
    with pytest.raises(ValueError, match=r'written by 2 training process\(es\) '
                       r'and this run has 1'):
        trainer.resume(epochs=2)
