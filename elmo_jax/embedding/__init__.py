"""The pieces :class:`elmo_jax.Elmo` is made of, one job each:

* :mod:`~elmo_jax.embedding.buckets`: the padded ``(rows, time)`` of a group;
* :mod:`~elmo_jax.embedding.host`: sentences -> token lists -> prepared groups (numpy, run
  in a thread ahead of the devices);
* :mod:`~elmo_jax.embedding.devices`: the devices, their 1-D mesh, placing arrays on it;
* :mod:`~elmo_jax.embedding.programs`: the jitted functions and what they compiled;
* :mod:`~elmo_jax.embedding.state`: zero and carried LSTM states;
* :mod:`~elmo_jax.embedding.token_cache`: the context-free token-vector cache;
* :mod:`~elmo_jax.embedding.outputs`: layer modes and per-sentence host arrays.
"""
