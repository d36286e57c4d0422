"""The compiled functions an ``Elmo`` runs, and what each has compiled.

* ``forward``: char ids ``[R, T, C]`` -> layers ``[L+1, R, T, 2P]`` and the new state;
* ``forward_vectors``: the same from token vectors ``[R, T, P]`` (the token cache);
* ``encode``: the char CNN alone, ``[N, C]`` -> ``[N, P]`` (cache building, uncached words);
* ``encode_markers``: the ``<S>`` / ``</S>`` vectors, kept per parameters and precision.

``compiled_shapes`` lists the ``(rows, time)`` of ``forward``; ``compiled_cache_shapes`` the
``("encoder", n)`` and ``("lstm", rows, time)`` of the cache path.  Each is compiled once
per input sharding, so the sets bound the compilations (see :mod:`elmo_jax.embedding.embedder`).
"""

from __future__ import annotations

import functools

import jax

from elmo_jax.embedding.token_cache import current_precision, same_leaves
from elmo_jax.model.bilm import bilm, bilm_from_token_vectors, marker_vectors
from elmo_jax.model.encoder import encode_tokens


class Programs:
    def __init__(self, dtype):
        self.forward = jax.jit(functools.partial(bilm, dtype=dtype), static_argnums=1)
        self.forward_vectors = jax.jit(functools.partial(bilm_from_token_vectors, dtype=dtype), static_argnums=1)
        self.encode = jax.jit(functools.partial(encode_tokens, dtype=dtype), static_argnums=1)
        self.encode_markers = jax.jit(functools.partial(marker_vectors, dtype=dtype), static_argnums=1)
        self.compiled_shapes: set[tuple[int, int]] = set()
        self.compiled_cache_shapes: set[tuple[str, int] | tuple[str, int, int]] = set()
        self._markers: tuple[object, list, tuple[jax.Array, jax.Array]] | None = None

    def markers(self, params: dict, config) -> tuple[jax.Array, jax.Array]:
        """The ``<S>`` / ``</S>`` vectors, encoded once per parameters (and matmul precision),
        not with every batch: one `small` sentence took 8.5 ms with them in the encoder
        pass, 7.9 ms without (2-core benchmark machine)."""
        leaves, precision = jax.tree.leaves(params), current_precision()
        if self._markers is None or self._markers[0] != precision or not same_leaves(self._markers[1], leaves):
            self._markers = (precision, leaves, self.encode_markers(params, config))
        return self._markers[2]
