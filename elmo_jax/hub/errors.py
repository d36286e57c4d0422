"""What fetching a model raises."""

from __future__ import annotations

from elmo_jax.errors import ElmoError


class DownloadError(ElmoError, OSError):
    """A model could not be fetched: an HTTP error, a connection that kept dropping, or
    files that do not form a model.  Nothing is left in the cache."""


class ChecksumError(ElmoError, ValueError):
    """A cached file whose sha256 differs from the one recorded when it was downloaded."""


class OfflineError(ElmoError, FileNotFoundError):
    """A model that is not cached, while offline or with the network unreachable."""


__all__ = ["ChecksumError", "DownloadError", "OfflineError"]
