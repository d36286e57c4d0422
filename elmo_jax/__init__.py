"""elmo-jax: ELMo's deep contextualized word representations in JAX.

Pure functions of (params, inputs) for the character encoder and the bidirectional
projected-LSTM language model, weight files in the released models' HDF5 layout, and
``Elmo`` for embedding text from a notebook.
"""

from elmo_jax import _moved
from elmo_jax.version import __version__ as __version__

_moved.install()

__all__ = [
    "ConfigError",
    "Elmo",
    "ElmoConfig",
    "TokenTruncatedWarning",
    "batch_to_ids",
    "count_params",
    "read_embeddings",
]


def __getattr__(name):
    # ``Elmo`` pulls in jax and h5py, the rest numpy: ``import elmo_jax`` stays light for the data
    # tools, and a program can install its stop handlers (elmo_jax.train.stop) before numpy loads.
    if name in ("TokenTruncatedWarning", "batch_to_ids"):
        from elmo_jax import chars

        return getattr(chars, name)
    if name in ("ConfigError", "ElmoConfig", "count_params"):
        from elmo_jax import config

        return getattr(config, name)
    # ``Elmo`` pulls in jax and h5py.  The package's one import that runs up a layer.
    if name in ("Elmo", "read_embeddings"):
        from elmo_jax import embedding

        return getattr(embedding, name)
    raise AttributeError(f"module 'elmo_jax' has no attribute {name!r}")
