"""Byte-pair-encoding subword tokenizer (Hugging Face ``tokenizers``) with a
lossless detokeniser: words carry a leading ``▁`` (SentencePiece's
metaspace), so decoding restores the whitespace-normalised text."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from pyg_metric_attn.utils.io import CorruptFileError, load_verified, save_verified
from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('experiments'):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

#: Special tokens, in index order: padding, begin and end of sequence, unknown.
SPECIAL_TOKENS = ('<pad>', '<bos>', '<eos>', '<unk>')


class SubwordTokenizer:
    r"""A BPE vocabulary learned from training sentences.

    Text is NFKC-normalised and split at whitespace; the special tokens
    :data:`SPECIAL_TOKENS` take indices 0 to 3.

    Args:
        tokenizer (tokenizers.Tokenizer): A trained tokenizer with the
            special tokens (see :meth:`train`).
    """
    def __init__(self, tokenizer: Tokenizer):
        ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
        if ids != list(range(len(SPECIAL_TOKENS))):
            raise ValueError(f"The tokenizer must map {SPECIAL_TOKENS} to "
                             f"indices 0-3, got {ids}")
        self.tokenizer = tokenizer
        self.pad_index, self.bos_index, self.eos_index, self.unk_index = ids

    @classmethod
    def train(cls, sentences: Sequence[str], vocab_size: int,
              min_frequency: int = 2) -> SubwordTokenizer:
        """Learn a BPE vocabulary of at most ``vocab_size`` tokens."""
        if vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"'vocab_size' must exceed {len(SPECIAL_TOKENS)}, "
                             f"got {vocab_size}")
        tokenizer = Tokenizer(models.BPE(unk_token='<unk>'))
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                             special_tokens=list(SPECIAL_TOKENS),
                             show_progress=False)
        tokenizer.train_from_iterator(sentences, trainer, length=len(sentences))
        return cls(tokenizer)

    @classmethod
    def cached(cls, path: str | Path, sentences: Sequence[str], vocab_size: int,
               min_frequency: int = 2) -> SubwordTokenizer:
        """Load the tokenizer cached at ``path`` if it was trained on the same
        sentences with the same settings, else train and cache it
        (atomically, checksummed)."""
        path = Path(path)
        key = {'vocab_size': vocab_size, 'min_frequency': min_frequency,
               'sentences_sha256': hashlib.sha256(
                   '\n'.join(sentences).encode('utf-8')).hexdigest()}
        if path.exists():
            try:
                state = load_verified(path)
            except CorruptFileError:
                state = None
            if state is not None and state.get('key') == key:
                return cls.from_json(state['tokenizer'])
        tokenizer = cls.train(sentences, vocab_size, min_frequency)
        try:
            save_verified({'key': key, 'tokenizer': tokenizer.to_json()}, path)
        except OSError as error:
            raise OSError(f"Cannot write the tokenizer cache '{path}' ({error}); "
                          f"point the data root at a writable copy of the "
                          f"raw files") from error
        return tokenizer

    @classmethod
    def from_json(cls, text: str) -> SubwordTokenizer:
        return cls(Tokenizer.from_str(text))

    def to_json(self) -> str:
        """The whole tokenizer (vocabulary, merges, special tokens) as JSON,
        e.g. to store with a checkpoint."""
        return self.tokenizer.to_str()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids of each sentence (no BOS/EOS)."""
        return [encoding.ids for encoding in
                self.tokenizer.encode_batch(list(sentences),
                                            add_special_tokens=False)]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Detokenised sentences; special tokens are dropped."""
        return self.tokenizer.decode_batch([list(row) for row in ids],
                                           skip_special_tokens=True)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(vocab_size={self.vocab_size})'
