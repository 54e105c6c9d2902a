"""Multi30k task 1 (Elliott et al. 2016): English-German descriptions of
Flickr30k images, 29,000 training, 1,014 validation and 1,000 test (2016
Flickr) sentence pairs, raw (true-cased, untokenised) text."""
from __future__ import annotations

import gzip
from pathlib import Path

from pyg_metric_attn.utils.download import download_url


class Multi30k:
    r"""The raw Multi30k task-1 files under ``root/raw``.

    The files ``{train,val,test_2016_flickr}.{en,de}.gz`` are read from
    ``root/raw``; only when one is missing and ``download=True`` are they
    fetched from the multi30k/dataset repository (``data/task1/raw``).
    Derived files (e.g. tokenizer caches) belong in :attr:`processed_dir`.

    Args:
        root (str or Path): Folder holding ``raw/``.
        download (bool, optional): Download missing files.
            (default: :obj:`True`)
    """
    url = 'https://github.com/multi30k/dataset/raw/master/data/task1/raw'
    languages = ('en', 'de')
    split_files = {'train': 'train', 'val': 'val', 'test': 'test_2016_flickr'}
    num_sentences = {'train': 29000, 'val': 1014, 'test': 1000}

    def __init__(self, root: str | Path = 'datasets/multi30k',
                 download: bool = True):
        self.root = Path(root)
        missing = [name for name in self.raw_file_names
                   if not (self.raw_dir / name).exists()]
        if missing and download:
            self.download(missing)

    @property
    def raw_dir(self) -> Path:
        return self.root / 'raw'

    @property
    def processed_dir(self) -> Path:
        return self.root / 'processed'

    @property
    def raw_file_names(self) -> list[str]:
        return [f'{stem}.{language}.gz' for stem in self.split_files.values()
                for language in self.languages]

    def raw_path(self, split: str, language: str) -> Path:
        if split not in self.split_files:
            raise ValueError(f"Unknown split '{split}'; expected one of "
                             f"{sorted(self.split_files)}")
        if language not in self.languages:
            raise ValueError(f"Unknown language '{language}'; expected one of "
                             f"{self.languages}")
        return self.raw_dir / f'{self.split_files[split]}.{language}.gz'

    def download(self, names: list[str]) -> None:
        for name in names:
            try:
                download_url(f'{self.url}/{name}', str(self.raw_dir))
            except OSError as error:
                raise FileNotFoundError(
                    f"Could not download '{name}' from {self.url} ({error}). "
                    f"Put the Multi30k task-1 raw files {self.raw_file_names} "
                    f"(from github.com/multi30k/dataset, data/task1/raw) into "
                    f"'{self.raw_dir}'") from error

    def sentences(self, split: str, language: str) -> list[str]:
        """The sentences of one side of a split, whitespace-normalised."""
        path = self.raw_path(split, language)
        if not path.exists():
            raise FileNotFoundError(
                f"Missing '{path}': put the Multi30k task-1 raw files "
                f"{self.raw_file_names} into '{self.raw_dir}' or construct "
                f"Multi30k(root, download=True) on a machine with internet")
        with gzip.open(path, 'rt', encoding='utf-8') as f:
            lines = [' '.join(line.split()) for line in f.read().splitlines()]
        if len(lines) != self.num_sentences[split]:
            raise ValueError(f"'{path}' has {len(lines)} lines, expected "
                             f"{self.num_sentences[split]} (corrupt or "
                             f"another version of the file?)")
        return lines

    def pairs(self, split: str, source: str, target: str) -> list[tuple[str, str]]:
        """``(source sentence, target sentence)`` pairs of a split."""
        return list(zip(self.sentences(split, source),
                        self.sentences(split, target), strict=True))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}('{self.root}')"
