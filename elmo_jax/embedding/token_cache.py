"""The context-free token-vector cache: words, their char-CNN vectors ``[n_vocab, P]``, and
what the vectors belong to (the parameters and matmul precision they were computed under).
Its HDF5 file holds one dataset ``embedding`` ``[n_vocab, P]`` (the originals' layout)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import h5py
import jax
import numpy as np

from elmo_jax.atomic import atomic_path
from elmo_jax.errors import ElmoError
from elmo_jax.formats.hdf5 import hdf5_damage

# A token cache read from a file is used under any matmul precision.
ANY_PRECISION = object()


def check_vocab(tokens: Sequence[str]) -> list[str]:
    """A vocabulary as a non-empty list of non-empty strings, or a clear error."""
    if isinstance(tokens, str):
        raise TypeError("cache_vocabulary takes a list of tokens, not a string")
    try:
        words = list(tokens)
    except TypeError:
        raise TypeError(f"cache_vocabulary takes a list of tokens, got {type(tokens).__name__}") from None
    if not words:
        raise ValueError("the vocabulary is empty")
    for w in words:
        if not isinstance(w, str) or not w:
            raise ValueError(f"vocabulary entries must be non-empty strings, got {w!r}")
    return words


def same_leaves(a: list, b: list) -> bool:
    """Whether two lists of parameter leaves are the very same arrays (parameters are
    immutable, so identity means the same values)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class TokenCache:
    """``words`` (repeats allowed: the first occurrence is looked up), ``vectors
    [n_vocab, P]``, the matmul ``precision`` they were computed under (``ANY_PRECISION``
    for a file's) and the parameter leaves they belong to."""

    def __init__(self, words: list[str], vectors: np.ndarray, precision: object, param_leaves: list):
        self.words = words
        self.vectors = vectors
        self.precision = precision
        self.param_leaves = param_leaves
        self.index: dict[str, int] = {}
        for i, w in enumerate(words):
            self.index.setdefault(w, i)

    def serves(self, precision: object) -> bool:
        """Whether calls under matmul ``precision`` may use these vectors."""
        return self.precision is ANY_PRECISION or self.precision == precision

    def belongs_to(self, param_leaves: list) -> bool:
        return same_leaves(self.param_leaves, param_leaves)

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.create_dataset("embedding", data=self.vectors)


def read_cache_vectors(path: str | os.PathLike, n_words: int, projection_dim: int) -> np.ndarray:
    """The ``embedding`` dataset of a token cache file, checked to be ``[n_words, P]``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"token cache file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        damage = hdf5_damage(path, e)
        if damage:
            raise ElmoError(
                f"{path} {damage}; copy the token cache again, or rebuild it with cache_vocabulary + save_token_cache"
            ) from None
        raise ElmoError(
            f"{path} is not a readable HDF5 token cache ({e}); the cache is the .hdf5 "
            f"file, the vocabulary the text file"
        ) from None
    with f:
        if "embedding" not in f:
            raise ElmoError(f"{path} has no dataset 'embedding' (found: {', '.join(f.keys()) or 'nothing'})")
        vectors = np.asarray(f["embedding"][...], np.float32)
    expected = (n_words, projection_dim)
    if vectors.shape != expected:
        raise ElmoError(
            f"{path}: 'embedding' has shape {vectors.shape}, expected {expected} "
            f"({n_words} vocabulary words x projection_dim {projection_dim})"
        )
    return vectors


def current_precision() -> object:
    """The matmul precision calls run under now (``None``: JAX's default)."""
    return jax.default_matmul_precision.value
