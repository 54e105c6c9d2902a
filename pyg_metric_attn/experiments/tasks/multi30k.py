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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from pyg_metric_attn.datasets import (
    Multi30k,
    SubwordTokenizer,
    bucket_batches,
    pad_sequences,
)
from pyg_metric_attn.experiments.config import TaskConfig, setting
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn.models import MetricTransformer, beam_search, greedy_decode
from pyg_metric_attn.training import (
    Trainer,
    epoch_generator,
    eval_mode,
    load_best_model,
    seed_everything,
    warmup_cosine,
)
from pyg_metric_attn.utils.io import atomic_write_text
from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('experiments'):
    import sacrebleu


@dataclass(frozen=True)
class Multi30kConfig(TaskConfig):
    """The Multi30k task's settings; the defaults are the ``small`` preset."""
    direction: Literal['de-en', 'en-de'] = 'de-en'
    root: str = 'datasets/multi30k'
    vocab_size: int = setting(8000, ge=4)
    # Model (MetricTransformer).
    num_layers: int = setting(3, ge=1)
    d_model: int = setting(256, ge=1)
    num_heads: int = setting(8, ge=1)
    dim_feedforward: int = setting(512, ge=1)
    share_embeddings: bool = True
    norm_first: bool = False
    dropout: float = setting(0.1, ge=0, lt=1)
    time_scale: float | Literal['matched'] = setting('matched', gt=0)
    learn_time_scale: bool = False
    mlp_channels: int | None = setting(None, ge=1)
    # Training.
    label_smoothing: float = setting(0.1, ge=0, lt=1)
    lr: float = setting(1e-3, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    adam_eps: float = setting(1e-9, gt=0)
    grad_clip: float | None = setting(1.0, gt=0)
    #: Tokens per training batch (source or target, padded).
    max_tokens: int = setting(3072, ge=1)
    warmup_steps: int = setting(250, ge=0)
    schedule: Literal['cosine', 'plateau'] = 'cosine'
    plateau_factor: float = setting(0.5, gt=0, lt=1)
    plateau_patience: int = setting(2, ge=0)
    #: The validation metric that picks the best epoch.
    monitor: Literal['val_bleu', 'val_loss', 'val_ppl'] = 'val_bleu'
    # Evaluation.
    beam_size: int = setting(4, ge=1)
    #: Length penalty exponent of beam search.
    alpha: float = setting(0.6, ge=0)
    eval_max_tokens: int = setting(8000, ge=1)
    #: Subsets for quick checks (None: everything).
    max_train_examples: int | None = setting(None, ge=1)
    max_eval_examples: int | None = setting(None, ge=1)


#: Changes of the defaults and the number of epochs, by preset.
PRESETS: dict[str, dict[str, Any]] = {
    # The CPU recipe, the same for every attention type: about an hour per
    # run on 2 cores (docs/results/multi30k.rst).
    'small': dict(epochs=15),
    # The paper's Transformer (Table 2) and its code base's optimiser.
    'base': dict(num_layers=6, d_model=512, num_heads=8, dim_feedforward=2048,
                 epochs=1000, lr=1e-5, weight_decay=5e-4, adam_eps=5e-9,
                 max_tokens=4096, warmup_steps=0, schedule='plateau',
                 plateau_factor=0.9, plateau_patience=10, monitor='val_loss'),
}


def preset_config(preset: str) -> tuple[Multi30kConfig, int]:
    """The config and the number of epochs of ``preset``."""
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset '{preset}'; expected one of "
                         f"{sorted(PRESETS)}")
    changes = dict(PRESETS[preset])
    epochs = changes.pop('epochs')
    return Multi30kConfig(**changes), epochs


class Multi30kTask(Task):
    """Multi30k translation with an encoder-decoder Transformer (paper, Sec. 5)."""
    name = 'multi30k'
    default_attentions = ('metric', 'dot')
    final_metric = 'test_bleu'
    curve_metrics = ('train_loss', 'val_loss', 'val_ppl', 'val_bleu')
    config_class = Multi30kConfig
    config: Multi30kConfig

    def __init__(self, config: Multi30kConfig | None = None, *,
                 epochs: int | None = None, progress: bool = True,
                 preset: str = 'small', **options: Any):
        base, preset_epochs = preset_config(preset)
        super().__init__(config or base, epochs=epochs or preset_epochs,
                         progress=progress, **options)
        self.preset = preset

    @classmethod
    def add_arguments(cls, parser: Any, command: str = 'experiment') -> None:
        parser.add_argument('--direction', choices=['de-en', 'en-de'],
                            help='translation direction (default: de-en)')
        parser.add_argument('--preset', choices=sorted(PRESETS),
                            help='model size and recipe (default: small)')
        parser.add_argument('--root', help='folder with raw/ (the Multi30k '
                            'task-1 files; default: datasets/multi30k)')

    def recorded_config(self) -> dict[str, Any]:
        return {**super().recorded_config(), 'preset': self.preset}

    def tokenizer(self, data: Multi30k) -> SubwordTokenizer:
        """The joint BPE vocabulary of both languages' training sentences."""
        sentences = [s for language in data.languages
                     for s in data.sentences('train', language)]
        size = self.config.vocab_size
        return SubwordTokenizer.cached(data.processed_dir / f'bpe-{size}.pt',
                                       sentences, size)

    def build_model(self, attention: str, vocab_size: int,
                    pad_index: int) -> MetricTransformer:
        c = self.config
        return MetricTransformer(
            vocab_size, vocab_size, d_model=c.d_model, num_heads=c.num_heads,
            num_encoder_layers=c.num_layers, num_decoder_layers=c.num_layers,
            dim_feedforward=c.dim_feedforward, dropout=c.dropout,
            attention=attention, norm_first=c.norm_first,
            share_embeddings=c.share_embeddings, pad_index=pad_index,
            time_scale=c.time_scale, learn_time_scale=c.learn_time_scale,
            mlp_channels=c.mlp_channels)

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        c = self.config
        data = Multi30k(c.root)
        tokenizer = self.tokenizer(data)
        source, target = c.direction.split('-')
        splits = {split: [tokenizer.encode(data.sentences(split, language))
                          for language in (source, target)]
                  for split in ('train', 'val', 'test')}
        references = {split: data.sentences(split, target)
                      for split in ('val', 'test')}
        # Subsets for quick checks (None = everything).
        for split, limit in (('train', c.max_train_examples),
                             ('val', c.max_eval_examples),
                             ('test', c.max_eval_examples)):
            splits[split] = [side[:limit] for side in splits[split]]
            if split in references:
                references[split] = references[split][:limit]
        train_src, train_tgt = splits['train']
        lengths = [max(len(s), len(t)) + 2
                   for s, t in zip(train_src, train_tgt, strict=True)]
        pad, bos, eos = tokenizer.pad_index, tokenizer.bos_index, tokenizer.eos_index

        seed_everything(seed)
        model = self.placement.move(
            self.build_model(attention, tokenizer.vocab_size, pad))
        optimizer = torch.optim.Adam(model.parameters(), lr=c.lr,
                                     betas=(0.9, 0.98), eps=c.adam_eps,
                                     weight_decay=c.weight_decay)
        steps_per_epoch = len(bucket_batches(lengths, c.max_tokens))
        if c.schedule == 'cosine':
            batch_scheduler = warmup_cosine(optimizer, c.warmup_steps,
                                            steps_per_epoch * self.epochs)
            scheduler = None
        else:
            batch_scheduler = (warmup_cosine(optimizer, c.warmup_steps)
                               if c.warmup_steps else None)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode=_mode(c.monitor), factor=c.plateau_factor,
                patience=c.plateau_patience)

        def batches(epoch: int):
            for index in bucket_batches(lengths, c.max_tokens,
                                        epoch_generator(seed, epoch)):
                yield (pad_sequences([train_src[i] for i in index], pad),
                       pad_sequences([train_tgt[i] for i in index], pad, bos, eos))

        def step(model: MetricTransformer, batch) -> torch.Tensor:
            return model.loss(*batch, label_smoothing=c.label_smoothing)

        val_src, val_tgt = splits['val']

        def evaluate(model: MetricTransformer) -> dict[str, float]:
            loss = corpus_loss(model, val_src, val_tgt, bos, eos, c.eval_max_tokens)
            hypotheses = tokenizer.decode(translate(
                model, val_src, bos, eos, c.eval_max_tokens))
            return {'val_loss': loss, 'val_ppl': math.exp(min(loss, 50.0)),
                    'val_bleu': corpus_bleu(hypotheses, references['val'])[0]}

        out_dir = self.checkpoint_dir(attention, seed)
        trainer = Trainer(
            model, optimizer, step, evaluate, scheduler=scheduler,
            batch_scheduler=batch_scheduler, monitor=c.monitor,
            mode=_mode(c.monitor), out_dir=out_dir, grad_clip=c.grad_clip,
            progress=self.progress, desc=f'multi30k {attention} seed {seed}',
            placement=self.placement,
            checkpoint_extras={'tokenizer': tokenizer.to_json(),
                               'model_config': self.model_config(attention)})
        history = trainer.fit(batches, self.epochs, resume=out_dir is not None)
        if out_dir is not None:
            load_best_model(model, out_dir)

        test_src, _ = splits['test']
        final: dict[str, float] = {'best_epoch': float(trainer.best['epoch'])}
        signature = ''
        for name, beam_size in (('greedy', 1), ('beam', c.beam_size)):
            with self.placement.autocast():
                hypotheses = tokenizer.decode(translate(
                    model, test_src, bos, eos, c.eval_max_tokens, beam_size,
                    c.alpha))
            final[f'test_bleu_{name}'], signature = corpus_bleu(
                hypotheses, references['test'])
            final[f'test_bleu_{name}_lc'], _ = corpus_bleu(
                hypotheses, references['test'], lowercase=True)
            if out_dir is not None:
                atomic_write_text(out_dir / f'test2016.{name}.{target}',
                                  '\n'.join(hypotheses) + '\n')
        final['test_bleu'] = final['test_bleu_beam']
        with self.placement.autocast():
            final['test_loss'] = corpus_loss(model, *splits['test'], bos, eos,
                                             c.eval_max_tokens)
        tqdm.write(f"multi30k {attention} seed {seed}: test BLEU "
                   f"{final['test_bleu']:.2f} (beam {c.beam_size}), "
                   f"{final['test_bleu_greedy']:.2f} (greedy); {signature}")
        return {'history': history, 'final': final, 'bleu_signature': signature,
                'num_parameters': sum(p.numel() for p in model.parameters())}

    def model_config(self, attention: str) -> dict[str, Any]:
        """The settings that rebuild the model (stored with checkpoints)."""
        keys = ('num_layers', 'd_model', 'num_heads', 'dim_feedforward',
                'dropout', 'norm_first', 'share_embeddings', 'time_scale',
                'learn_time_scale', 'mlp_channels', 'direction')
        return {'attention': attention,
                **{key: getattr(self.config, key) for key in keys}}

    def checkpoint_dir(self, attention: str, seed: int) -> Path | None:
        """Per-run checkpoints under the experiment folder, keyed by the
        config so that only an identical run resumes from them."""
        if self.work_dir is None:
            return None
        digest = hashlib.sha256(json.dumps(self.recorded_config(), sort_keys=True,
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


def corpus_loss(model: MetricTransformer, sources: Sequence[Sequence[int]],
                targets: Sequence[Sequence[int]], bos: int, eos: int,
                max_tokens: int) -> float:
    """Mean token cross entropy (nats, no label smoothing) of the targets
    (each followed by EOS), on the device of ``model``."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    lengths = [max(len(s), len(t)) + 2 for s, t in zip(sources, targets, strict=True)]
    with eval_mode(model):
        for index in bucket_batches(lengths, max_tokens):
            src = pad_sequences([sources[i] for i in index],
                                model.pad_index).to(device)
            tgt = pad_sequences([targets[i] for i in index], model.pad_index,
                                bos, eos).to(device)
            total += float(model.loss(src, tgt, reduction='sum'))
            count += int((tgt[:, 1:] != model.pad_index).sum())
    return total / count


def translate(model: MetricTransformer, sources: Sequence[Sequence[int]],
              bos: int, eos: int, max_tokens: int, beam_size: int = 1,
              alpha: float = 0.6) -> list[list[int]]:
    """Token ids of the translations, in input order (greedy decoding for
    ``beam_size=1``, else beam search), decoded on the device of ``model``."""
    device = next(model.parameters()).device
    outputs: list[list[int]] = [[] for _ in sources]
    lengths = [(len(s) + 2) * beam_size for s in sources]
    with eval_mode(model):
        for index in bucket_batches(lengths, max_tokens):
            src = pad_sequences([sources[i] for i in index],
                                model.pad_index).to(device)
            if beam_size == 1:
                decoded = greedy_decode(model, src, bos, eos)
            else:
                decoded = beam_search(model, src, bos, eos, beam_size, alpha)
            for i, tokens in zip(index, decoded, strict=True):
                outputs[i] = tokens
    return outputs
