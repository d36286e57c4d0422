"""``Elmo``: load a model, embed sentences, save it — the notebook entry point.

    elmo = Elmo.load("path/to/model")            # options.json + weights.hdf5
    vectors = elmo.embed(["She went to the bank .", ["tokens", "as", "a", "list"]])
    vectors[0].shape                             # (L+1, n_tokens, 2P)

Batching and compilation: sentences are grouped into padded arrays of shape
``[rows, time]`` where ``time`` is a power of two >= 8 (the bucket of the longest sentence
in the group) and ``rows`` is a power of two <= ``batch_size``.  Each distinct shape is
compiled once per ``Elmo`` object, so the number of compilations is at most
``len(time buckets used) * (log2(batch_size) + 1)`` whatever the input;
``elmo.compiled_shapes`` lists them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.config import ConfigError, ElmoConfig
from elmo_jax.model.bilm import bilm, init_params
from elmo_jax.model.lstm import zero_state
from elmo_jax.weights import load_weights, save_weights

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
MIN_TIME_BUCKET = 8

Sentence = str | Sequence[str]


def time_bucket(n_tokens: int) -> int:
    """The padded length used for a group whose longest sentence has ``n_tokens``."""
    return max(MIN_TIME_BUCKET, 1 << max(0, n_tokens - 1).bit_length())


def row_bucket(n_rows: int, batch_size: int) -> int:
    """The padded number of rows for a group of ``n_rows`` sentences."""
    return min(batch_size, 1 << max(0, n_rows - 1).bit_length())


class Elmo:
    """A biLM with its parameters, ready to embed text.

    Deterministic by default: every call starts from the zero LSTM state.  With
    ``embed(..., stateful=True)`` the state is carried from call to call (row ``i`` of a
    batch continues row ``i`` of the previous one), the originals' behaviour;
    :meth:`reset_state` forgets it.
    """

    def __init__(self, config: ElmoConfig, params: dict, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.config = config
        self.params = jax.tree.map(jnp.asarray, params)
        self.batch_size = batch_size
        self.compiled_shapes: set[tuple[int, int]] = set()
        self._state: dict | None = None
        self._forward = jax.jit(bilm, static_argnums=1)

    # -- construction and persistence -------------------------------------------------
    @classmethod
    def load(
        cls,
        model_dir: str | os.PathLike | None = None,
        *,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        batch_size: int = 64,
    ) -> "Elmo":
        """From a folder (``options.json`` + ``weights.hdf5``) or from the two files."""
        if model_dir is not None:
            if options_file is not None or weight_file is not None:
                raise ValueError("give either model_dir or options_file + weight_file, not both")
            model_dir = os.fspath(model_dir)
            if not os.path.isdir(model_dir):
                raise FileNotFoundError(f"model folder not found: {model_dir}")
            options_file = os.path.join(model_dir, OPTIONS_FILE)
            weight_file = _find_weight_file(model_dir)
        elif options_file is None or weight_file is None:
            raise ValueError("Elmo.load needs model_dir, or both options_file and weight_file")
        if not os.path.exists(options_file):
            raise FileNotFoundError(f"options file not found: {options_file}")
        config = ElmoConfig.from_json_file(options_file)
        return cls(config, load_weights(weight_file, config), batch_size=batch_size)

    @classmethod
    def random(cls, config: ElmoConfig | str = "tiny", seed: int = 0, batch_size: int = 64) -> "Elmo":
        """A randomly initialised model (a preset name or an ``ElmoConfig``)."""
        if isinstance(config, str):
            config = ElmoConfig.preset(config)
        return cls(config, init_params(jax.random.key(seed), config), batch_size=batch_size)

    def save(self, model_dir: str | os.PathLike, overwrite: bool = False) -> None:
        """Write ``options.json`` + ``weights.hdf5`` in the released models' layout."""
        model_dir = os.fspath(model_dir)
        targets = [os.path.join(model_dir, n) for n in (OPTIONS_FILE, WEIGHTS_FILE)]
        existing = [t for t in targets if os.path.exists(t)]
        if existing and not overwrite:
            raise FileExistsError(
                f"{', '.join(existing)} already exist(s); pass overwrite=True to replace"
            )
        os.makedirs(model_dir, exist_ok=True)
        save_weights(self.params, self.config, targets[1])
        tmp = targets[0] + ".tmp"
        self.config.to_json_file(tmp)
        os.replace(tmp, targets[0])

    # -- embedding --------------------------------------------------------------------
    def reset_state(self) -> None:
        """Forget the LSTM state carried by ``stateful=True`` calls."""
        self._state = None

    def embed(
        self,
        sentences: Sentence | Sequence[Sentence],
        *,
        stateful: bool = False,
        batch_size: int | None = None,
    ) -> list[np.ndarray]:
        """One float32 array ``[L+1, n_tokens, 2P]`` per sentence, in input order.

        ``sentences``: strings (split on whitespace) or token lists, any lengths, any
        order.  An empty sentence gives ``[L+1, 0, 2P]``.
        """
        if isinstance(sentences, str):
            raise TypeError(
                "embed() takes a list of sentences; wrap a single sentence as [sentence]"
            )
        token_lists = [chars.tokenize(s) for s in sentences]
        batch_size = self.batch_size if batch_size is None else batch_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if stateful and batch_size > self.batch_size:
            raise ValueError(
                f"stateful batch_size {batch_size} exceeds the model's batch_size "
                f"{self.batch_size} (the number of carried state rows); create the Elmo "
                f"with a larger batch_size"
            )
        out: list[np.ndarray | None] = [None] * len(token_lists)
        if stateful:
            groups = [list(range(i, min(i + batch_size, len(token_lists))))
                      for i in range(0, len(token_lists), batch_size)]
        else:
            empty = np.zeros((self.config.n_output_layers, 0, self.config.output_dim), np.float32)
            for i, t in enumerate(token_lists):
                if not t:
                    out[i] = empty.copy()
            order = sorted((i for i, t in enumerate(token_lists) if t), key=lambda i: len(token_lists[i]))
            groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        for group in groups:
            layers = self._run_group([token_lists[i] for i in group], stateful, batch_size)
            for row, i in enumerate(group):
                out[i] = np.ascontiguousarray(layers[:, row, : len(token_lists[i])])
        return out  # type: ignore[return-value]

    def _run_group(self, token_lists: list[list[str]], stateful: bool, batch_size: int) -> np.ndarray:
        n_rows = row_bucket(len(token_lists), batch_size) if not stateful else batch_size
        n_time = time_bucket(max(len(t) for t in token_lists))
        ids = np.zeros((n_rows, n_time, self.config.char_cnn.max_characters_per_token), np.int32)
        ids[: len(token_lists)] = chars.batch_to_ids(
            token_lists, self.config.char_cnn.max_characters_per_token, max_length=n_time
        )
        lengths = np.full((n_rows,), -1, np.int32)
        lengths[: len(token_lists)] = [len(t) for t in token_lists]
        state = None
        if stateful:
            if self._state is None:
                self._state = zero_state(self.config, self.batch_size)
            state = jax.tree.map(lambda s: s[:, :, :n_rows], self._state)
        self.compiled_shapes.add((n_rows, n_time))
        layers, new_state = self._forward(self.params, self.config, ids, state, lengths)
        if stateful:
            self._state = jax.tree.map(
                lambda old, new: old.at[:, :, :n_rows].set(new), self._state, new_state
            )
        return np.asarray(layers)


def _find_weight_file(model_dir: str) -> str:
    preferred = os.path.join(model_dir, WEIGHTS_FILE)
    if os.path.exists(preferred):
        return preferred
    candidates = sorted(f for f in os.listdir(model_dir) if f.endswith(".hdf5") and "weights" in f)
    if len(candidates) == 1:
        return os.path.join(model_dir, candidates[0])
    if not candidates:
        raise FileNotFoundError(
            f"{model_dir} has no {WEIGHTS_FILE} (nor another *weights*.hdf5 file); "
            f"a model folder holds {OPTIONS_FILE} and {WEIGHTS_FILE}"
        )
    raise FileNotFoundError(
        f"{model_dir} has several weight files ({', '.join(candidates)}) and no "
        f"{WEIGHTS_FILE}; pass weight_file= explicitly"
    )


__all__ = ["Elmo", "ConfigError", "time_bucket", "row_bucket"]
