"""Data sets and text processing."""
from pyg_metric_attn.datasets.batching import bucket_batches, pad_sequences
from pyg_metric_attn.datasets.multi30k import Multi30k
from pyg_metric_attn.datasets.subword import SPECIAL_TOKENS, SubwordTokenizer

__all__ = ['SPECIAL_TOKENS', 'Multi30k', 'SubwordTokenizer', 'bucket_batches',
           'pad_sequences']
