"""The on-disk formats of a model, one module each; each reads a local folder into values
(config, params, vocabulary) and, where it makes sense, writes one.  Nothing here downloads
or imports the hub: :mod:`elmo_jax.hub` fetches, :mod:`elmo_jax.resolve` turns a spec into a
local folder and passes the cache folder in where a format keeps a conversion.

* :mod:`~elmo_jax.formats.folder`: which format a folder is in, read into the model's values
  (the one call the resolver makes);
* :mod:`~elmo_jax.formats.hdf5`: bilm-tf's / AllenNLP's ``options.json`` + ``weights.hdf5``;
* :mod:`~elmo_jax.formats.manylangs`: HIT-SCIR's ELMoForManyLangs (``.dic`` files and torch
  pickles, read by :mod:`~elmo_jax.formats.torch_pickle` without torch);
* :mod:`~elmo_jax.formats.training_run`: a folder ``elmo-jax train`` wrote, read from its
  checkpoint and exported; :mod:`~elmo_jax.formats.run_exports`: such exports kept in a cache
  folder.
"""
