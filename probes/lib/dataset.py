"""A map-style dataset over the files of a directory, for the DataLoader check of train_step.

No torch import: DataLoader accepts any object with __len__ and __getitem__, and a plain
class pickles to the loader's worker processes. Each sample is one file read whole; the
batch is reduced to (files, bytes) so no data crosses back to the main process.
"""
from __future__ import annotations

import os


class FileDataset:
    def __init__(self, root: str, max_files: int = 100_000) -> None:
        files = []
        for dirpath, _dirs, names in os.walk(root, onerror=_raise):
            for n in sorted(names):
                files.append(os.path.join(dirpath, n))
                if len(files) >= max_files:
                    break
        if not os.path.isdir(root):
            raise NotADirectoryError(f"{root}: not a directory")
        self.files = sorted(files)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> int:
        with open(self.files[i], "rb") as f:
            return len(f.read())


def collate(sizes: list[int]) -> tuple[int, int]:
    return len(sizes), sum(sizes)


def _raise(exc: OSError) -> None:
    raise exc
