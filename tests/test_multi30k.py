"""Multi30k loader on the real files, BPE tokenizer round trip and cache,
length buckets, the warm-up schedule and the multi30k task end to end."""
from __future__ import annotations

import json
import shutil
import unicodedata
import urllib.error

import pytest
import torch
from conftest import shared_dataset

import pyg_metric_attn.datasets.multi30k as multi30k_module
import pyg_metric_attn.experiments as experiments
import pyg_metric_attn.experiments.tasks.multi30k as multi30k_task
from pyg_metric_attn.cli import main
from pyg_metric_attn.datasets import (
    Multi30k,
    SubwordTokenizer,
    bucket_batches,
    pad_sequences,
)
from pyg_metric_attn.experiments import TASKS, run_experiment
from pyg_metric_attn.training import WarmupCosine
from pyg_metric_attn.utils.io import load_verified


@pytest.fixture(scope='module')
def data():
    return Multi30k(shared_dataset('multi30k'), download=False)


@pytest.fixture
def no_network(monkeypatch):
    def refuse(url, folder, *args, **kwargs):
        raise urllib.error.URLError(f'no network for {url}')
    monkeypatch.setattr(multi30k_module, 'download_url', refuse)


def test_line_counts_and_alignment_of_the_real_files(data):
    for split, count in (('train', 29000), ('val', 1014), ('test', 1000)):
        for language in ('en', 'de'):
            sentences = data.sentences(split, language)
            assert len(sentences) == count
            assert all(sentences)
    first = data.pairs('val', 'de', 'en')[0]
    assert first == ('Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen',
                     'A group of men are loading cotton onto a truck')


def test_present_files_are_never_downloaded(data, tmp_path, no_network):
    shutil.copytree(data.raw_dir, tmp_path / 'raw')
    copy = Multi30k(tmp_path)  # download=True, but nothing is missing
    assert len(copy.sentences('test', 'en')) == 1000


def test_offline_without_files_says_where_to_put_them(tmp_path, no_network):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / 'raw')):
        Multi30k(tmp_path)
    with pytest.raises(FileNotFoundError, match='train.en.gz'):
        Multi30k(tmp_path, download=False).sentences('train', 'en')
    with pytest.raises(ValueError, match="Unknown split 'dev'"):
        Multi30k(tmp_path, download=False).sentences('dev', 'en')


def test_a_download_without_answer_times_out(tmp_path, silent_server,
                                             monkeypatch):
    monkeypatch.setattr(Multi30k, 'url', silent_server)
    with pytest.raises(FileNotFoundError, match=r"no answer within 0\.5 s.*Put "
                       r"the Multi30k task-1 raw files"):
        Multi30k(tmp_path)


def test_tokenizer_round_trip_and_cache(data, tmp_path, monkeypatch):
    train = data.sentences('train', 'de') + data.sentences('train', 'en')
    path = tmp_path / 'bpe.pt'
    tokenizer = SubwordTokenizer.cached(path, train, 8000)
    assert tokenizer.vocab_size == 8000
    assert (tokenizer.pad_index, tokenizer.bos_index, tokenizer.eos_index,
            tokenizer.unk_index) == (0, 1, 2, 3)
    held_out = data.sentences('test', 'de') + data.sentences('test', 'en')
    ids = tokenizer.encode(held_out)
    assert tokenizer.decode(ids) == [unicodedata.normalize('NFKC', s)
                                     for s in held_out]
    # Subwords, not characters or whole sentences.
    assert 1.05 < sum(map(len, ids)) / sum(len(s.split()) for s in held_out) < 2
    # The checkpoint copy (JSON) restores the same tokenizer.
    restored = SubwordTokenizer.from_json(tokenizer.to_json())
    assert restored.encode(held_out[:50]) == ids[:50]

    def no_training(*args, **kwargs):
        raise AssertionError('retrained although the cache is valid')
    with monkeypatch.context() as patch:
        patch.setattr(SubwordTokenizer, 'train', no_training)
        assert SubwordTokenizer.cached(path, train, 8000).to_json() == \
            tokenizer.to_json()
    # Other sentences or a corrupt cache: retrained and rewritten.
    assert SubwordTokenizer.cached(path, train[:500], 600).vocab_size <= 600
    assert load_verified(path)['key']['vocab_size'] == 600
    path.write_bytes(path.read_bytes()[:-20])
    assert SubwordTokenizer.cached(path, train[:500], 600).vocab_size <= 600
    with pytest.raises(OSError, match='writable copy'):
        SubwordTokenizer.cached(path / 'not-a-folder.pt', train[:500], 600)


def test_bucket_batches_cover_every_example_within_the_token_budget():
    lengths = torch.randint(1, 40, (500,), generator=torch.Generator().manual_seed(0))
    for generator in (None, torch.Generator().manual_seed(1)):
        batches = bucket_batches(lengths.tolist(), 200, generator)
        assert sorted(i for b in batches for i in b) == list(range(500))
        padded = [int(max(lengths[batch])) * len(batch) for batch in batches]
        assert max(padded) <= 200
        assert int(lengths.sum()) / sum(padded) > 0.85  # similar lengths
    assert bucket_batches([5, 50, 7], 12) == [[0], [2], [1]]  # too long: alone
    assert bucket_batches([5, 50, 7], 14) == [[0, 2], [1]]
    assert bucket_batches([3, 1], 10) == bucket_batches([3, 1], 10)
    padded = pad_sequences([[5, 6], [7]], pad_index=0, bos_index=1, eos_index=2)
    assert padded.tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]


def test_warmup_cosine_factor():
    schedule = WarmupCosine(warmup_steps=4, total_steps=14, final_fraction=0.1)
    assert [schedule(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule(9) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedule(14) == schedule(100) == pytest.approx(0.1)
    assert WarmupCosine(2)(50) == 1.0
    with pytest.raises(ValueError, match='must exceed'):
        WarmupCosine(5, 5)


def test_task_end_to_end_reuse_and_resume(data, tmp_path):
    """A tiny run through the runner that learns: logs, report,
    checkpoints holding the vocabulary; finished runs are reused,
    interrupted ones resumed."""
    shutil.copytree(data.raw_dir, tmp_path / 'data' / 'raw')
    options = dict(root=tmp_path / 'data', d_model=32, num_heads=4, num_layers=1,
                   dim_feedforward=64, vocab_size=500, max_train_examples=200,
                   max_eval_examples=8, warmup_steps=2, beam_size=2, lr=1e-2,
                   epochs=4)
    task = TASKS['multi30k'](progress=False, **options)
    summary = run_experiment(task, ['metric'], [0], tmp_path / 'out',
                             progress=False)
    assert summary['metric']['runs'] == 1
    run_path = tmp_path / 'out' / 'runs' / 'metric-seed0.json'
    record = json.loads(run_path.read_text())
    assert record['status'] == 'ok', record.get('traceback')
    assert record['bleu_signature'].startswith('nrefs:1|case:mixed|eff:no|tok:13a')
    assert [row['epoch'] for row in record['history']] == [1, 2, 3, 4]
    assert {'val_loss', 'val_ppl', 'val_bleu'} <= set(record['history'][0])
    assert 0 <= record['final']['test_bleu'] <= 100
    for name in ('curves.png', 'summary.md', 'summary.json'):
        assert (tmp_path / 'out' / name).exists()
    checkpoint, = (tmp_path / 'out' / 'checkpoints').glob('metric-seed0-*/best.pt')
    greedy = (checkpoint.parent / 'test2016.greedy.en').read_text().splitlines()
    assert len(greedy) == 8
    state = load_verified(checkpoint)
    vocabulary = SubwordTokenizer.from_json(state['tokenizer']).vocab_size
    assert vocabulary <= 500
    # Learning: the validation perplexity falls every epoch, to under half
    # the uniform guess's (the vocabulary size; measured 352, 218, 180,
    # 158; BLEU stays near 0 in so short a run).
    perplexities = [row['val_ppl'] for row in record['history']]
    assert all(b < a for a, b in zip(perplexities[:-1], perplexities[1:],
                                     strict=True))
    assert perplexities[-1] < vocabulary / 2, (perplexities, vocabulary)
    assert state['model_config']['attention'] == 'metric'
    assert (tmp_path / 'data' / 'processed' / 'bpe-500.pt').exists()

    # A finished run with the same config is reused, not run again.
    again = TASKS['multi30k'](progress=False, **options)
    again.run = None
    run_experiment(again, ['metric'], [0], tmp_path / 'out', progress=False)
    assert json.loads(run_path.read_text()) == record
    # A run that died after its last epoch resumes from its checkpoint.
    run_path.unlink()
    run_experiment(TASKS['multi30k'](progress=False, **options),
                   ['metric'], [0], tmp_path / 'out', progress=False)
    resumed = json.loads(run_path.read_text())
    assert resumed['history'] == record['history']
    assert resumed['final'] == record['final']
    with pytest.raises(ValueError, match='Unknown multi30k options'):
        TASKS['multi30k'](beams=3)
    with pytest.raises(ValueError, match="direction='fr-en' must be 'de-en' or "
                       "'en-de'"):
        TASKS['multi30k'](direction='fr-en')


def test_plateau_schedule_and_the_en_de_direction(data, tmp_path, monkeypatch):
    """``schedule='plateau'`` steps ReduceLROnPlateau once per epoch on the
    monitored metric with the task's factor and patience: the learning
    rates of the epochs are those of torch's scheduler fed the recorded
    metric. ``direction='en-de'``: English sources, German translations."""
    shutil.copytree(data.raw_dir, tmp_path / 'data' / 'raw')
    sources = []
    pad_sequences = multi30k_task.pad_sequences

    def recording(sequences, pad, *bos_eos):
        if not bos_eos:  # the source side
            sources.extend(sequences)
        return pad_sequences(sequences, pad, *bos_eos)

    monkeypatch.setattr(multi30k_task, 'pad_sequences', recording)
    task = TASKS['multi30k'](
        root=tmp_path / 'data', d_model=32, num_heads=4, num_layers=1,
        dim_feedforward=64, vocab_size=500, max_train_examples=200,
        max_eval_examples=8, beam_size=2, epochs=4, lr=1e-2, warmup_steps=0,
        schedule='plateau', plateau_factor=0.5, plateau_patience=0,
        monitor='val_bleu', direction='en-de', progress=False)
    run_experiment(task, ['metric'], [0], tmp_path / 'out', progress=False)
    record = json.loads((tmp_path / 'out' / 'runs' / 'metric-seed0.json')
                        .read_text())
    assert record['status'] == 'ok', record.get('traceback')
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-2)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode='max', factor=0.5, patience=0)
    expected = []
    for row in record['history']:
        expected.append(optimizer.param_groups[0]['lr'])
        plateau.step(row['val_bleu'])
    assert [row['lr'] for row in record['history']] == pytest.approx(expected)
    assert len(set(expected)) > 1  # it did reduce the rate
    checkpoint, = (tmp_path / 'out' / 'checkpoints').glob('metric-seed0-*/best.pt')
    assert (checkpoint.parent / 'test2016.greedy.de').exists()
    tokenizer = SubwordTokenizer.from_json(load_verified(checkpoint)['tokenizer'])
    english = {sentence for split in ('train', 'val', 'test')
               for sentence in data.sentences(split, 'en')}
    decoded = tokenizer.decode(sources)
    assert len(decoded) > 200 and set(decoded) <= english


def test_preset_and_direction_flags_build_the_task(monkeypatch, tmp_path):
    """``--preset base`` takes the paper's recipe (and its 1000 epochs),
    ``--direction`` the translation direction."""
    built = []

    def run_nothing(task, *args, **kwargs):
        built.append(task)
        raise RuntimeError('not run')

    monkeypatch.setattr(experiments, 'run_experiment', run_nothing)
    assert main(['experiment', 'multi30k', '--preset', 'base', '--direction',
                 'en-de', '--out', str(tmp_path), '--no-progress']) == 1
    task, = built
    assert (task.preset, task.epochs) == ('base', 1000)
    c = task.config
    assert (c.num_layers, c.d_model, c.num_heads, c.dim_feedforward) == (
        6, 512, 8, 2048)
    assert (c.schedule, c.plateau_factor, c.plateau_patience, c.monitor,
            c.lr, c.direction) == ('plateau', 0.9, 10, 'val_loss', 1e-5, 'en-de')
    assert task.recorded_config()['preset'] == 'base'
