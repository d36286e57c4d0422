"""All of embedding: :class:`elmo_jax.Elmo`, embedding files, and reading what they wrote.

* :mod:`~elmo_jax.embedding.embedder`: :class:`~elmo_jax.embedding.embedder.Elmo`, the facade;
* :mod:`~elmo_jax.embedding.embed_file`: a text file of any size -> an HDF5 file, resumable
  (:mod:`~elmo_jax.embedding.embed_input` reads the input in groups of lines,
  :mod:`~elmo_jax.embedding.embed_layouts` writes the output's layouts,
  :mod:`~elmo_jax.embedding.embed_state` records where a run stopped);
* :mod:`~elmo_jax.embedding.embeddings_reader`: :func:`~elmo_jax.embedding.embeddings_reader.read_embeddings`.

The pieces ``Elmo`` is made of, one job each:

* :mod:`~elmo_jax.embedding.buckets`: the padded ``(rows, time)`` of a group;
* :mod:`~elmo_jax.embedding.host`: sentences -> token lists -> prepared groups (numpy, run
  in a thread ahead of the devices);
* :mod:`~elmo_jax.embedding.devices`: the devices, their 1-D mesh, placing arrays on it;
* :mod:`~elmo_jax.embedding.programs`: the jitted functions and what they compiled;
* :mod:`~elmo_jax.embedding.state`: zero and carried LSTM states;
* :mod:`~elmo_jax.embedding.token_cache`: the context-free token-vector cache;
* :mod:`~elmo_jax.embedding.outputs`: layer modes and per-sentence host arrays.
"""


def __getattr__(name):
    # Lazy, so that importing one piece does not import Elmo (and jax with it).
    if name == "Elmo":
        from elmo_jax.embedding.embedder import Elmo

        return Elmo
    if name == "read_embeddings":
        from elmo_jax.embedding.embeddings_reader import read_embeddings

        return read_embeddings
    raise AttributeError(f"module 'elmo_jax.embedding' has no attribute {name!r}")
