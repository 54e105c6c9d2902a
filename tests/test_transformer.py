"""MetricTransformer: causal and padding masks, incremental decoding, beam
search against exhaustive search, and overfitting 32 real sentence pairs."""
from __future__ import annotations

import itertools
import math

import pytest
import sacrebleu
import torch
from conftest import shared_dataset

from pyg_metric_attn.datasets import Multi30k, SubwordTokenizer, pad_sequences
from pyg_metric_attn.nn import (
    MetricAttentionalAggregation,
    MetricAttentionConv,
    MetricMeshFormer,
    MetricMultiheadAttention,
)
from pyg_metric_attn.nn.models import MetricTransformer, beam_search, greedy_decode
from pyg_metric_attn.nn.models.decoding import length_penalty
from pyg_metric_attn.nn.time_scale import matched_time_scale

METRICS = ['metric', 'l2', 'dot']


def tiny_model(attention, norm_first=False, vocab=40, **kwargs):
    torch.manual_seed(0)
    return MetricTransformer(vocab, vocab, d_model=32, num_heads=4,
                             num_encoder_layers=2, num_decoder_layers=2,
                             dim_feedforward=64, attention=attention,
                             norm_first=norm_first, time_scale='matched',
                             **kwargs).double().eval()


@pytest.fixture(params=list(itertools.product(METRICS, ['post-norm', 'pre-norm'])),
                ids='-'.join)
def model(request):
    """A float64 model per attention type and layer-norm placement."""
    attention, norm = request.param
    return tiny_model(attention, norm_first=norm == 'pre-norm')


def test_decoder_does_not_peek_at_future_tokens(model):
    src = torch.randint(4, 40, (3, 9))
    tgt = torch.randint(4, 40, (3, 8))
    logits = model(src, tgt)
    for i in (0, 3, 6):
        changed = tgt.clone()
        changed[:, i + 1:] = torch.randint(4, 40, changed[:, i + 1:].shape)
        other = model(src, changed)
        torch.testing.assert_close(other[:, :i + 1], logits[:, :i + 1])
        # The changed tokens do reach later positions (the test can fail).
        assert not torch.allclose(other[:, i + 1:], logits[:, i + 1:])


def test_padding_does_not_change_real_tokens(model):
    src = torch.randint(4, 40, (2, 7))
    tgt = torch.randint(4, 40, (2, 6))
    padded_src = torch.cat([src, src.new_zeros(2, 5)], dim=1)
    padded_tgt = torch.cat([tgt, tgt.new_zeros(2, 3)], dim=1)
    memory, _ = model.encode(src)
    padded_memory, mask = model.encode(padded_src)
    assert mask[:, 7:].all() and not mask[:, :7].any()
    torch.testing.assert_close(padded_memory[:, :7], memory)
    torch.testing.assert_close(model(padded_src, padded_tgt)[:, :6],
                               model(src, tgt))
    # Without the padding mask the pads would leak in.
    unmasked = model.decode(tgt, padded_memory, None)
    assert not torch.allclose(unmasked, model(src, tgt))


def test_incremental_decoding_matches_full_prefix(model):
    src = torch.randint(4, 40, (3, 6))
    src[1, 4:] = 0
    tgt = torch.randint(4, 40, (3, 7))
    memory, mask = model.encode(src)
    full = model.decoder_states(tgt, memory, mask)
    cache, states = None, []
    for i in range(tgt.size(1)):
        state, cache = model.decoder_step(tgt[:, i], memory, mask, cache)
        states.append(state)
    torch.testing.assert_close(torch.stack(states, dim=1), full)


def test_matched_time_scale_and_bad_arguments():
    assert matched_time_scale('dot', 64) == 1.0
    assert matched_time_scale('metric', 64) == matched_time_scale('l2', 64) == 16.0
    model = tiny_model('l2')
    # D: the metric width per head, one less than the head width (8)
    assert model.decoder_layers[0].cross_attn.time_scale == 2 * math.sqrt(7)
    with pytest.raises(ValueError, match='one vocabulary'):
        MetricTransformer(10, 12, 16, 2, share_embeddings=True)
    with pytest.raises(ValueError, match='divisible'):
        MetricTransformer(10, 10, 18, 4)
    with pytest.raises(ValueError, match="'matched'"):
        MetricTransformer(10, 10, 16, 2, time_scale='auto')
    with pytest.raises(ValueError, match='Unknown metric'):
        MetricTransformer(10, 10, 16, 2, attention='cosine')


@pytest.mark.parametrize('metric', METRICS)
def test_every_attention_module_takes_the_matched_time_scale(metric):
    matched = 1.0 if metric == 'dot' else 2 * math.sqrt(4)  # D = 4 per head
    conv = MetricAttentionConv(6, 4, heads=3, metric=metric,
                               time_scale='matched')
    assert conv.time_scale == matched
    # The conv's D is its metric dimension per head.
    wide = MetricAttentionConv(6, 4, metric=metric, metric_channels=9,
                               time_scale='matched')
    assert wide.time_scale == (1.0 if metric == 'dot' else 6.0)
    # The dense layers' D is their metric width: one less than the head's
    # (4) for the distance metrics.
    dense_matched = 1.0 if metric == 'dot' else 2 * math.sqrt(3)
    mha = MetricMultiheadAttention(12, 3, metric=metric, time_scale='matched')
    assert mha.time_scale == dense_matched
    former = MetricMeshFormer(5, 2, hidden_channels=8, heads=2, metric=metric,
                              time_scale='matched', learn_time_scale=False)
    # The former's global step measures at the head width, as its local one.
    assert former.blocks[0].local.time_scale == matched
    assert former.blocks[0].global_attention.time_scale == matched
    model = MetricTransformer(10, 10, 8, 2, 1, 1, 16, attention=metric,
                              time_scale='matched')
    assert model.encoder_layers[0].self_attn.time_scale == dense_matched
    if metric != 'dot':  # pooling scores by a distance only
        pool = MetricAttentionalAggregation(6, 3, metric=metric,
                                            metric_channels=4,
                                            time_scale='matched')
        assert pool.time_scale() == matched
    for make in (lambda t: MetricAttentionConv(6, 4, time_scale=t),
                 lambda t: MetricMultiheadAttention(8, 2, time_scale=t),
                 lambda t: MetricMeshFormer(5, 2, hidden_channels=8, heads=2,
                                            time_scale=t)):
        with pytest.raises(ValueError, match="positive number or 'matched'"):
            make('auto')
        with pytest.raises(ValueError, match="'time_scale' must be a positive"):
            make(-1.0)


@pytest.mark.parametrize('attention', METRICS)
def test_beam_search_finds_the_exhaustive_optimum(attention):
    """With a beam as wide as all hypotheses, beam search must return the
    best length-normalised sequence of a brute-force enumeration."""
    vocab, bos, eos, steps, alpha = 6, 1, 2, 3, 0.8
    model = tiny_model(attention, vocab=vocab)
    src = torch.tensor([[4, 5, 4, 3]])
    memory, mask = model.encode(src)

    # Cumulative log-probabilities of every token sequence of full length;
    # by causality its first n entries score its n-token prefix.
    bodies = torch.tensor(list(itertools.product(range(vocab), repeat=steps)))
    tokens = torch.cat([torch.full((len(bodies), 1), bos), bodies], dim=1)
    with torch.no_grad():
        logits = model.decode(tokens[:, :-1], memory.expand(len(bodies), -1, -1),
                              mask.expand(len(bodies), -1))
    cumulative = torch.log_softmax(logits, -1).gather(
        -1, bodies[..., None])[..., 0].cumsum(-1)
    best, best_score = None, -math.inf
    for body, scores in zip(bodies.tolist(), cumulative.tolist(), strict=True):
        for n in range(1, steps + 1):
            if eos in body[:n - 1] or (n < steps and body[n - 1] != eos):
                continue
            score = scores[n - 1] / float(length_penalty(torch.tensor(n), alpha))
            if score > best_score:
                best, best_score = body[:n], score
    found = beam_search(model, src, bos, eos, beam_size=vocab**steps, alpha=alpha,
                        max_len_a=0, max_len_b=steps)
    assert found == [best[:-1] if best[-1] == eos else best]


@pytest.fixture(scope='module')
def overfitted():
    """A tiny metric-attention model trained on the 32 shortest DE->EN
    training pairs of Multi30k, with a BPE vocabulary of those pairs."""
    data = Multi30k(shared_dataset('multi30k'), download=False)
    pairs = sorted(data.pairs('train', 'de', 'en'),
                   key=lambda p: (len(p[0]) + len(p[1]), p))[:32]
    sources, targets = map(list, zip(*pairs, strict=True))
    tokenizer = SubwordTokenizer.train(sources + targets, 400, min_frequency=1)
    src = pad_sequences(tokenizer.encode(sources), tokenizer.pad_index)
    tgt = pad_sequences(tokenizer.encode(targets), tokenizer.pad_index,
                        tokenizer.bos_index, tokenizer.eos_index)
    torch.manual_seed(0)
    model = MetricTransformer(tokenizer.vocab_size, tokenizer.vocab_size,
                              d_model=64, num_heads=4, num_encoder_layers=1,
                              num_decoder_layers=1, dim_feedforward=128,
                              dropout=0.0, share_embeddings=True,
                              time_scale='matched')
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):  # reaches BLEU 100 after about 40 steps
        optimizer.zero_grad()
        loss = model.loss(src, tgt)
        loss.backward()
        optimizer.step()
    return model.eval(), tokenizer, src, targets


def test_tiny_model_overfits_32_pairs(overfitted):
    model, tokenizer, src, targets = overfitted
    for beam_size in (1, 4):
        hypotheses = tokenizer.decode(beam_search(
            model, src, tokenizer.bos_index, tokenizer.eos_index, beam_size))
        assert sacrebleu.corpus_bleu(hypotheses, [targets]).score > 90


def test_beam_size_one_equals_greedy(overfitted):
    model, tokenizer, src, _ = overfitted
    bos, eos = tokenizer.bos_index, tokenizer.eos_index
    greedy = greedy_decode(model, src, bos, eos)
    assert beam_search(model, src, bos, eos, beam_size=1, alpha=0.0) == greedy
    assert beam_search(model, src, bos, eos, beam_size=1, alpha=1.0) == greedy
    assert all(eos not in tokens for tokens in greedy)
    # An untrained model decodes differently (the comparison is not vacuous).
    torch.manual_seed(1)
    fresh = MetricTransformer(tokenizer.vocab_size, tokenizer.vocab_size, 64, 4,
                              1, 1, 128).eval()
    assert greedy_decode(fresh, src, bos, eos) != greedy
    assert beam_search(fresh, src, bos, eos, beam_size=1) == \
        greedy_decode(fresh, src, bos, eos)
