"""Multi30k translation (the paper's Transformer experiment): an
encoder-decoder :class:`~pyg_metric_attn.nn.models.MetricTransformer` with
metric-, L2- or dot-product attention in every attention block.

Text is tokenised with one joint BPE vocabulary learned on the training
split of both languages (cached in ``ROOT/processed``, stored with every
checkpoint). Each epoch reports the training loss, validation loss and
perplexity (unsmoothed token-level cross entropy) and validation BLEU
(greedy decoding); at the end the best epoch's model translates test2016
with greedy decoding and beam search. BLEU is sacrebleu's corpus BLEU on the
detokenised output against the raw references (cased; a lowercased score is
recorded too), its signature stored with the result.

Presets: ``small`` (3 + 3 layers, d = 256, 8 heads, FFN 512; a CPU recipe)
and ``base`` (the paper's 6 + 6 layers, d = 512, 8 heads, FFN 2048, Adam with
lr 1e-5 and weight decay 5e-4, ReduceLROnPlateau, as in the
hyunwoongko/transformer code base; for a GPU). Every option can be changed
with ``-o KEY=VALUE``; every attention type runs the same recipe.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from tqdm.auto import tqdm

from pyg_metric_attn.datasets import (
    Multi30k,
    SubwordTokenizer,
    bucket_batches,
    pad_sequences,
)
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn.models import MetricTransformer, beam_search, greedy_decode
from pyg_metric_attn.training import (
    Trainer,
    load_best_model,
    seed_everything,
    warmup_cosine,
)
from pyg_metric_attn.utils.io import atomic_write_text

COMMON: dict[str, Any] = dict(
    direction='de-en', root='datasets/multi30k', vocab_size=8000,
    share_embeddings=True, norm_first=False, dropout=0.1, label_smoothing=0.1,
    time_scale='matched', learn_time_scale=False, mlp_channels=None,
    grad_clip=1.0, beam_size=4, alpha=0.6, eval_max_tokens=8000,
    max_train_examples=None, max_eval_examples=None, plateau_factor=0.5,
    plateau_patience=2)

PRESETS: dict[str, dict[str, Any]] = {
    # CPU recipe, fixed before the runs (see RESULTS.md): about an hour per
    # run on 2 cores; identical for every attention type.  (The first runs
    # used 6 epochs; 15 reached the 37 BLEU goal.)
    'small': dict(num_layers=3, d_model=256, num_heads=8, dim_feedforward=512,
                  epochs=15, lr=1e-3, weight_decay=0.0, adam_eps=1e-9,
                  max_tokens=3072, warmup_steps=250, schedule='cosine',
                  monitor='val_bleu'),
    # The paper's Transformer (Table 2) and its code base's optimiser.
    'base': dict(num_layers=6, d_model=512, num_heads=8, dim_feedforward=2048,
                 epochs=1000, lr=1e-5, weight_decay=5e-4, adam_eps=5e-9,
                 max_tokens=4096, warmup_steps=0, schedule='plateau',
                 plateau_factor=0.9, plateau_patience=10, monitor='val_loss'),
}


class Multi30kTask(Task):
    """Multi30k translation with an encoder-decoder Transformer (paper, Sec. 5)."""
    name = 'multi30k'
    default_attentions = ('metric', 'dot')
    final_metric = 'test_bleu'
    curve_metrics = ('train_loss', 'val_loss', 'val_ppl', 'val_bleu')

    def __init__(self, epochs: int | None = None, progress: bool = True,
                 preset: str = 'small', **options: Any):
        if preset not in PRESETS:
            raise ValueError(f"Unknown preset '{preset}'; expected one of "
                             f"{sorted(PRESETS)}")
        merged = self.with_defaults({**COMMON, **PRESETS[preset]}, options)
        if merged['direction'] not in ('de-en', 'en-de'):
            raise ValueError(f"'direction' must be 'de-en' or 'en-de', got "
                             f"'{merged['direction']}'")
        if merged['schedule'] not in ('cosine', 'plateau'):
            raise ValueError(f"'schedule' must be 'cosine' or 'plateau', got "
                             f"'{merged['schedule']}'")
        merged['root'] = str(merged['root'])
        preset_epochs = merged.pop('epochs')
        super().__init__(epochs=epochs or preset_epochs, progress=progress,
                         preset=preset, **merged)

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument('--direction', choices=['de-en', 'en-de'],
                            help='translation direction (default: de-en)')
        parser.add_argument('--preset', choices=sorted(PRESETS),
                            help='model size and recipe (default: small)')
        parser.add_argument('--root', help='folder with raw/ (the Multi30k '
                            'task-1 files; default: datasets/multi30k)')

    def tokenizer(self, data: Multi30k) -> SubwordTokenizer:
        """The joint BPE vocabulary of both languages' training sentences."""
        sentences = [s for language in data.languages
                     for s in data.sentences('train', language)]
        size = self.options['vocab_size']
        return SubwordTokenizer.cached(data.processed_dir / f'bpe-{size}.pt',
                                       sentences, size)

    def build_model(self, attention: str, vocab_size: int,
                    pad_index: int) -> MetricTransformer:
        o = self.options
        return MetricTransformer(
            vocab_size, vocab_size, d_model=o['d_model'], num_heads=o['num_heads'],
            num_encoder_layers=o['num_layers'], num_decoder_layers=o['num_layers'],
            dim_feedforward=o['dim_feedforward'], dropout=o['dropout'],
            attention=attention, norm_first=o['norm_first'],
            share_embeddings=o['share_embeddings'], pad_index=pad_index,
            time_scale=o['time_scale'], learn_time_scale=o['learn_time_scale'],
            mlp_channels=o['mlp_channels'])

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        o = self.options
        data = Multi30k(o['root'])
        tokenizer = self.tokenizer(data)
        source, target = o['direction'].split('-')
        splits = {split: [tokenizer.encode(data.sentences(split, language))
                          for language in (source, target)]
                  for split in ('train', 'val', 'test')}
        references = {split: data.sentences(split, target)
                      for split in ('val', 'test')}
        # Subsets for quick checks (None = everything).
        for split, limit in (('train', o['max_train_examples']),
                             ('val', o['max_eval_examples']),
                             ('test', o['max_eval_examples'])):
            splits[split] = [side[:limit] for side in splits[split]]
            if split in references:
                references[split] = references[split][:limit]
        train_src, train_tgt = splits['train']
        lengths = [max(len(s), len(t)) + 2
                   for s, t in zip(train_src, train_tgt, strict=True)]
        pad, bos, eos = tokenizer.pad_index, tokenizer.bos_index, tokenizer.eos_index

        seed_everything(seed)
        model = self.build_model(attention, tokenizer.vocab_size, pad)
        optimizer = torch.optim.Adam(model.parameters(), lr=o['lr'],
                                     betas=(0.9, 0.98), eps=o['adam_eps'],
                                     weight_decay=o['weight_decay'])
        steps_per_epoch = len(bucket_batches(lengths, o['max_tokens']))
        if o['schedule'] == 'cosine':
            batch_scheduler = warmup_cosine(optimizer, o['warmup_steps'],
                                            steps_per_epoch * self.epochs)
            scheduler = None
        else:
            batch_scheduler = (warmup_cosine(optimizer, o['warmup_steps'])
                               if o['warmup_steps'] else None)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode=_mode(o['monitor']), factor=o['plateau_factor'],
                patience=o['plateau_patience'])

        def batches(epoch: int):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            for index in bucket_batches(lengths, o['max_tokens'], generator):
                yield (pad_sequences([train_src[i] for i in index], pad),
                       pad_sequences([train_tgt[i] for i in index], pad, bos, eos))

        def step(model: MetricTransformer, batch) -> torch.Tensor:
            return model.loss(*batch, label_smoothing=o['label_smoothing'])

        val_src, val_tgt = splits['val']

        def evaluate(model: MetricTransformer) -> dict[str, float]:
            loss = corpus_loss(model, val_src, val_tgt, bos, eos, o['eval_max_tokens'])
            hypotheses = tokenizer.decode(translate(
                model, val_src, bos, eos, o['eval_max_tokens']))
            return {'val_loss': loss, 'val_ppl': math.exp(min(loss, 50.0)),
                    'val_bleu': corpus_bleu(hypotheses, references['val'])[0]}

        out_dir = self.checkpoint_dir(attention, seed)
        trainer = Trainer(
            model, optimizer, step, evaluate, scheduler=scheduler,
            batch_scheduler=batch_scheduler, monitor=o['monitor'],
            mode=_mode(o['monitor']), out_dir=out_dir, grad_clip=o['grad_clip'],
            progress=self.progress, desc=f'multi30k {attention} seed {seed}',
            checkpoint_extras={'tokenizer': tokenizer.to_json(),
                               'model_config': self.model_config(attention)})
        history = trainer.fit(batches, self.epochs, resume=out_dir is not None)
        if out_dir is not None:
            load_best_model(model, out_dir)

        model.eval()
        test_src, _ = splits['test']
        final: dict[str, float] = {'best_epoch': float(trainer.best['epoch'])}
        signature = ''
        for name, beam_size in (('greedy', 1), ('beam', o['beam_size'])):
            hypotheses = tokenizer.decode(translate(
                model, test_src, bos, eos, o['eval_max_tokens'], beam_size,
                o['alpha']))
            final[f'test_bleu_{name}'], signature = corpus_bleu(
                hypotheses, references['test'])
            final[f'test_bleu_{name}_lc'], _ = corpus_bleu(
                hypotheses, references['test'], lowercase=True)
            if out_dir is not None:
                atomic_write_text(out_dir / f'test2016.{name}.{target}',
                                  '\n'.join(hypotheses) + '\n')
        final['test_bleu'] = final['test_bleu_beam']
        final['test_loss'] = corpus_loss(model, *splits['test'], bos, eos,
                                         o['eval_max_tokens'])
        tqdm.write(f"multi30k {attention} seed {seed}: test BLEU "
                   f"{final['test_bleu']:.2f} (beam {o['beam_size']}), "
                   f"{final['test_bleu_greedy']:.2f} (greedy); {signature}")
        return {'history': history, 'final': final, 'bleu_signature': signature,
                'num_parameters': sum(p.numel() for p in model.parameters())}

    def model_config(self, attention: str) -> dict[str, Any]:
        """The settings that rebuild the model (stored with checkpoints)."""
        keys = ('num_layers', 'd_model', 'num_heads', 'dim_feedforward',
                'dropout', 'norm_first', 'share_embeddings', 'time_scale',
                'learn_time_scale', 'mlp_channels', 'direction')
        return {'attention': attention, **{k: self.options[k] for k in keys}}

    def checkpoint_dir(self, attention: str, seed: int) -> Path | None:
        """Per-run checkpoints under the experiment folder, keyed by the
        config so that only an identical run resumes from them."""
        if self.work_dir is None:
            return None
        digest = hashlib.sha256(json.dumps(self.config(), sort_keys=True,
                                           default=str).encode()).hexdigest()
        return (Path(self.work_dir) / 'checkpoints'
                / f'{attention}-seed{seed}-{digest[:10]}')


def _mode(monitor: str) -> str:
    return 'min' if monitor.endswith(('loss', 'ppl')) else 'max'


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str],
                lowercase: bool = False) -> tuple[float, str]:
    """sacrebleu corpus BLEU (13a tokenisation) of detokenised sentences and
    the metric's signature."""
    metric = sacrebleu.BLEU(lowercase=lowercase)
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(metric.get_signature())


@torch.no_grad()
def corpus_loss(model: MetricTransformer, sources: Sequence[Sequence[int]],
                targets: Sequence[Sequence[int]], bos: int, eos: int,
                max_tokens: int) -> float:
    """Mean token cross entropy (nats, no label smoothing) of the targets
    (each followed by EOS)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    lengths = [max(len(s), len(t)) + 2 for s, t in zip(sources, targets, strict=True)]
    for index in bucket_batches(lengths, max_tokens):
        src = pad_sequences([sources[i] for i in index], model.pad_index)
        tgt = pad_sequences([targets[i] for i in index], model.pad_index, bos, eos)
        total += float(model.loss(src, tgt, reduction='sum'))
        count += int((tgt[:, 1:] != model.pad_index).sum())
    model.train(was_training)
    return total / count


@torch.no_grad()
def translate(model: MetricTransformer, sources: Sequence[Sequence[int]],
              bos: int, eos: int, max_tokens: int, beam_size: int = 1,
              alpha: float = 0.6) -> list[list[int]]:
    """Token ids of the translations, in input order (greedy decoding for
    ``beam_size=1``, else beam search)."""
    was_training = model.training
    model.eval()
    outputs: list[list[int]] = [[] for _ in sources]
    lengths = [(len(s) + 2) * beam_size for s in sources]
    for index in bucket_batches(lengths, max_tokens):
        src = pad_sequences([sources[i] for i in index], model.pad_index)
        if beam_size == 1:
            decoded = greedy_decode(model, src, bos, eos)
        else:
            decoded = beam_search(model, src, bos, eos, beam_size, alpha)
        for i, tokens in zip(index, decoded, strict=True):
            outputs[i] = tokens
    model.train(was_training)
    return outputs
