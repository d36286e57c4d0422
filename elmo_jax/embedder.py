"""``Elmo``: load a model, embed sentences, save it — the notebook entry point.

    elmo = Elmo.load("path/to/model")            # options.json + weights.hdf5
    vectors = elmo.embed(["She went to the bank .", ["tokens", "as", "a", "list"]])
    vectors[0].shape                             # (L+1, n_tokens, 2P)
    elmo.embed(sentences, layers="top")          # [n_tokens, 2P] each; also "average", "mix"
    elmo.sentence_vectors(sentences)             # [N, 2P]: mean over tokens

Batching and compilation
------------------------
Sentences are grouped into padded arrays ``[rows, time]``.  The model runs its LSTMs over
``time + 2`` steps (it adds ``<S>`` and ``</S>`` inside), so the *scan length* ``time + 2``
is what is bucketed: it is the smallest value of the ladder

    8, 12, 16, 24, 32, 48, 64, 96, 128, ...   (2^k and 1.5 * 2^k, k >= 3)

that holds ``n + 2`` for the longest sentence of the group (``n`` tokens).  Consecutive
rungs differ by at most 1.5x, so at most a third of the steps is padding (the original
power-of-two scheme wasted up to half); on the CPU the LSTMs skip those steps (they stop
after the group's longest sentence, :func:`elmo_jax.model.lstm.steps_in_use`).
``time_bucket(n)`` returns ``time`` (the rung minus 2: 6, 10, 14, 22, 30, 46, 62, ...).
Sentences are sorted by length, each goes to its
bucket, and each bucket is cut into groups of ``batch_size`` rows; a group's ``rows`` is
the next power of two (capped at ``batch_size``).  Each distinct ``(rows, time)`` is
compiled once per ``Elmo`` object (and matmul precision), stateful or not, so the number
of compilations is bounded whatever the input and however many calls::

    max_compiled_shapes(max_len) = n_time_buckets(max_len) * n_row_buckets(batch_size)
    n_time_buckets(m) = number of rungs <= rung(m + 2)       (about 2 log2((m + 2) / 8) + 1)
    n_row_buckets(b)  = ceil(log2(b)) + 1                    (1, 2, 4, ..., b)

e.g. sentences up to 60 tokens at ``batch_size=64`` compile at most 7 * 7 = 49 shapes, and
in practice far fewer (a full batch per bucket plus one partial group).
``elmo.compiled_shapes`` lists the shapes compiled so far.  ``stateful=True`` always uses
``rows = batch_size`` (the rows of the carried state).

Token-vector cache
------------------
``elmo.cache_vocabulary(words)`` runs the char CNN once over a vocabulary and keeps the
context-free vectors ``[n_vocab, P]`` (layer 0's first half).  While a cache is set,
``embed`` looks cached words up instead of running the CNN; only the group's distinct
uncached words go through the CNN (padded to a power of two >= 16 tokens, so that encoder
compiles at most ``ceil(log2(batch_size * T)) - 3`` times in all, ``T`` the longest time
bucket used: the sizes 16, 32, ... are shared by every bucket), and the LSTMs run
from the token vectors (:func:`elmo_jax.model.bilm.bilm_from_token_vectors`).  The results
equal the uncached ones to float rounding (<= 1e-6); calls under another
``jax.default_matmul_precision`` than the cache was computed under bypass it.  Those compilations are listed in
``elmo.compiled_cache_shapes``.  ``save_token_cache`` / ``load_token_cache`` store it as
HDF5 with one dataset ``embedding`` ``[n_vocab, P]`` (the originals' token-embedding file).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Iterator, Sequence

import h5py
import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.atomic import atomic_path, refuse_output_over_inputs
from elmo_jax.config import ConfigError, ElmoConfig
from elmo_jax.data.vocab import read_token_lines
from elmo_jax.errors import ElmoError
from elmo_jax.model.bilm import bilm, bilm_from_token_vectors, init_params, marker_vectors
from elmo_jax.model.encoder import encode_tokens
from elmo_jax.model.heads import scalar_mix
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.precision import compute_dtype
from elmo_jax.weights import hdf5_damage, load_weights, save_weights

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
MIN_SCAN_LENGTH = 8
N_MARKERS = 2
MIN_ENCODER_TOKENS = 16
# Above this many sentences, ``embed(progress=None)`` shows a progress bar.
PROGRESS_THRESHOLD = 1000
LAYER_MODES = ("all", "top", "average", "mix")
# A token cache read from a file is used under any matmul precision.
_ANY_PRECISION = object()

Sentence = str | Sequence[str]


def scan_length_bucket(n_steps: int) -> int:
    """The smallest rung of 8, 12, 16, 24, 32, 48, ... that is >= ``n_steps``."""
    n_steps = max(n_steps, MIN_SCAN_LENGTH)
    k = (n_steps - 1).bit_length() - 1  # 2^k < n_steps <= 2^(k+1)
    if n_steps <= 3 << (k - 1):
        return 3 << (k - 1)
    return 1 << (k + 1)


def time_bucket(n_tokens: int) -> int:
    """The padded token length of a group whose longest sentence has ``n_tokens``."""
    return scan_length_bucket(n_tokens + N_MARKERS) - N_MARKERS


def time_buckets(max_len: int) -> list[int]:
    """Every padded token length used for sentences of 0..``max_len`` tokens."""
    out, t = [], time_bucket(0)
    while True:
        out.append(t)
        if t >= max_len:
            return out
        t = time_bucket(t + 1)


def row_bucket(n_rows: int, batch_size: int) -> int:
    """The padded number of rows for a group of ``n_rows`` sentences."""
    return min(batch_size, 1 << max(0, n_rows - 1).bit_length())


def n_row_buckets(batch_size: int) -> int:
    return math.ceil(math.log2(batch_size)) + 1


def _encoder_bucket(n_tokens: int) -> int:
    return max(MIN_ENCODER_TOKENS, 1 << max(0, n_tokens - 1).bit_length())


class Elmo:
    """A biLM with its parameters, ready to embed text.

    Deterministic by default: every call starts from the zero LSTM state.  With
    ``embed(..., stateful=True)`` the state is carried from call to call (row ``i`` of a
    batch continues row ``i`` of the previous one), the originals' behaviour;
    :meth:`reset_state` forgets it.
    """

    def __init__(self, config: ElmoConfig, params: dict, batch_size: int = 64, dtype: str = "float32",
                 token_ids=None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if token_ids is None and config.vocab is not None:
            raise ValueError("a vocabulary model (config.vocab) needs token_ids=VocabIds(...) from its .dic files; "
                             "Elmo.load(folder) reads them")
        # Tokens -> ids: UTF-8 bytes, or a vocabulary model's char.dic / word.dic (manylangs.VocabIds).
        self.token_ids = token_ids or chars.ByteIds(config.char_cnn.max_characters_per_token)
        self.config = config
        self.params = jax.tree.map(jnp.asarray, params)
        self.batch_size = batch_size
        # "bfloat16": matmul operands in bf16, params, cell state, accumulation and outputs
        # float32 (outputs within ~1e-2 relative of float32; see README "Speed").
        self.dtype = compute_dtype(dtype)
        self.compiled_shapes: set[tuple[int, int]] = set()
        self.compiled_cache_shapes: set[tuple[str, int] | tuple[str, int, int]] = set()
        self._state: dict | None = None
        self._zero_states: dict[int, dict] = {}
        self._forward = jax.jit(functools.partial(bilm, dtype=self.dtype), static_argnums=1)
        self._forward_vectors = jax.jit(functools.partial(bilm_from_token_vectors, dtype=self.dtype),
                                        static_argnums=1)
        self._encode = jax.jit(functools.partial(encode_tokens, dtype=self.dtype), static_argnums=1)
        self._encode_markers = jax.jit(functools.partial(marker_vectors, dtype=self.dtype), static_argnums=1)
        self._markers: tuple[tuple, tuple[jax.Array, jax.Array]] | None = None
        self._cache_words: list[str] | None = None
        self._cache_index: dict[str, int] = {}
        self._cache_vectors: np.ndarray | None = None
        self._cache_precision: object = _ANY_PRECISION
        self._cache_params: list = []  # the parameter leaves the cache belongs to
        # The files this model was read from ({role: absolute path}): outputs never replace them.
        self.source_files: dict[str, str] = {}
        self._truncation_said = False  # the over-long-token warning is given once per object

    # -- construction and persistence -------------------------------------------------
    @classmethod
    def load(
        cls,
        model_dir: str | os.PathLike | None = None,
        *,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        batch_size: int = 64,
        dtype: str = "float32",
        progress: bool = True,
    ) -> "Elmo":
        """From a folder or from the two files.

        A folder holds ``options.json`` + ``weights.hdf5`` (what :meth:`save` and
        ``elmo-jax export`` write; other files beside them, such as an export's
        ``vocab.txt`` and ``softmax.hdf5``, are ignored).  Folders of the released models,
        with one ``*options*.json`` and one ``*weights*.hdf5`` under other names, load too.
        ``model_dir`` may also be a released model's name (``"original"``) or an http(s)
        URL: :func:`elmo_jax.hub.resolve_model` downloads it once into the cache.
        ``progress=False`` turns the download's progress bar off.  A folder of HIT-SCIR's
        ELMoForManyLangs (``config.json``, ``char.dic``, ``word.dic``, ``*.pkl``) is converted
        once into the model cache (:mod:`elmo_jax.manylangs`) and read from there.
        Raises ``FileNotFoundError`` naming a missing file and
        :class:`elmo_jax.weights.WeightFileError` naming the first dataset that does not
        fit the options.
        """
        if model_dir is not None:
            if options_file is not None or weight_file is not None:
                raise ValueError("give either model_dir or options_file + weight_file, not both")
            model_dir = os.fspath(model_dir)
            if not os.path.exists(model_dir):
                from elmo_jax import hub

                if hub.is_model_spec(model_dir):  # a released model's name or a URL: the cached copy
                    model_dir = os.fspath(hub.resolve_model(model_dir, progress=progress))
            if os.path.isfile(model_dir):
                raise ElmoError(
                    f"{model_dir} is a file; Elmo.load takes the model folder "
                    f"({os.path.dirname(model_dir) or '.'}), or options_file= and weight_file="
                )
            if not os.path.isdir(model_dir):
                from elmo_jax import hub

                raise FileNotFoundError(f"model folder not found: {model_dir}" + hub._suggestion(model_dir))
            from elmo_jax import manylangs

            if manylangs.is_manylangs_folder(model_dir) and not os.path.exists(os.path.join(model_dir, OPTIONS_FILE)):
                model_dir = os.fspath(manylangs.cached_conversion(model_dir))  # converted once, then HDF5
            options_file = _find_file(model_dir, OPTIONS_FILE, "options", ".json")
            weight_file = _find_file(model_dir, WEIGHTS_FILE, "weights", ".hdf5")
        elif options_file is None or weight_file is None:
            raise ValueError("Elmo.load needs model_dir, or both options_file and weight_file")
        if not os.path.exists(options_file):
            raise FileNotFoundError(f"options file not found: {options_file}")
        config = ElmoConfig.from_json_file(options_file)
        token_ids = None
        if config.vocab is not None:  # a converted ELMoForManyLangs model: its .dic files lie beside
            from elmo_jax import manylangs

            folder = os.path.dirname(os.path.abspath(options_file))
            manylangs.check_vocab_files(folder, config)
            token_ids = manylangs.VocabIds.from_folder(folder, config)
        elmo = cls(config, load_weights(weight_file, config), batch_size=batch_size, dtype=dtype,
                   token_ids=token_ids)
        elmo.source_files = {"model's options file": os.path.abspath(options_file),
                             "model's weight file": os.path.abspath(weight_file)}
        return elmo

    @classmethod
    def random(cls, config: ElmoConfig | str = "tiny", seed: int = 0, batch_size: int = 64,
               dtype: str = "float32") -> "Elmo":
        """A randomly initialised model (a preset name or an ``ElmoConfig``)."""
        if isinstance(config, str):
            config = ElmoConfig.preset(config)
        return cls(config, init_params(jax.random.key(seed), config), batch_size=batch_size, dtype=dtype)

    def save(self, model_dir: str | os.PathLike, overwrite: bool = False) -> None:
        """Write ``options.json`` + ``weights.hdf5`` in the released models' layout.

        Both files are written under temporary names first and renamed into place only when
        both are complete, so a failure while writing (a full disk, Ctrl-C) leaves an
        existing pair as it was: never new weights beside old options.  Other files in
        ``model_dir`` are left alone.
        """
        model_dir = os.fspath(model_dir)
        targets = [os.path.join(model_dir, n) for n in (OPTIONS_FILE, WEIGHTS_FILE)]
        existing = [t for t in targets if os.path.exists(t)]
        if existing and not overwrite:
            raise FileExistsError(
                f"{', '.join(existing)} already exist(s); pass overwrite=True to replace"
            )
        os.makedirs(model_dir, exist_ok=True)
        with atomic_path(targets[1]) as weights_tmp, atomic_path(targets[0]) as options_tmp:
            save_weights(self.params, self.config, weights_tmp)
            self.config.to_json_file(options_tmp)
            if self.config.vocab is not None:  # a vocabulary model's .dic files go with it
                self.token_ids.save(model_dir)

    # -- compilation bound ------------------------------------------------------------
    def max_compiled_shapes(self, max_len: int, batch_size: int | None = None) -> int:
        """The most ``(rows, time)`` shapes that embedding sentences of at most ``max_len``
        tokens can ever compile (see the module docstring)."""
        batch_size = self.batch_size if batch_size is None else batch_size
        return len(time_buckets(max_len)) * n_row_buckets(batch_size)

    # -- embedding --------------------------------------------------------------------
    def reset_state(self) -> None:
        """Forget the LSTM state carried by ``stateful=True`` calls."""
        self._state = None

    def embed(
        self,
        sentences: Sequence[Sentence],
        layers: str = "all",
        *,
        batch_size: int | None = None,
        stateful: bool = False,
        progress: bool | None = None,
        mix_params: dict | None = None,
    ) -> list[np.ndarray]:
        """One float32 array per sentence, in input order.

        ``sentences``: strings (split on whitespace) or token lists, any number, any
        lengths, any order.  ``layers``:

        * ``"all"``: ``[L+1, n_tokens, 2P]`` (layer 0 = token vectors ``[e; e]``);
        * ``"top"``: ``[n_tokens, 2P]``, the last LSTM layer;
        * ``"average"``: ``[n_tokens, 2P]``, the mean of the ``L+1`` layers;
        * ``"mix"``: ``[n_tokens, 2P]``, :func:`elmo_jax.model.heads.scalar_mix` with
          ``mix_params`` (``{"scalars": [L+1], "gamma": ()}``, e.g. the ``"mix"`` part of a
          head trained as ``"mix"``).  No layer norm: a ``"mix:layer_norm"`` head takes its
          statistics from a batch of sentences, so apply it to ``layers="all"`` output with
          :func:`elmo_jax.finetune.tagger_logits` or ``scalar_mix(..., layer_norm=True)``.

        Each array is C-contiguous; the arrays of one padded group (up to ``batch_size``
        sentences) are slices of one buffer, which lives as long as any of them does.
        An empty sentence gives ``[L+1, 0, 2P]`` (or ``[0, 2P]``).  ``progress``: a tqdm
        bar; ``None`` shows it for more than 1000 sentences.  ``stateful``: carry the LSTM
        state between batches (see the class docstring); the default is deterministic.
        """
        sentences = _sentence_list(sentences)
        out: list[np.ndarray | None] = [None] * len(sentences)
        for indices, arrays in self.embed_groups(
            sentences, layers, batch_size=batch_size, stateful=stateful, progress=progress, mix_params=mix_params
        ):
            for i, a in zip(indices, arrays):
                out[i] = a
        return out  # type: ignore[return-value]

    def sentence_vectors(
        self,
        sentences: Sequence[Sentence],
        layers: str = "average",
        **kwargs,
    ) -> np.ndarray:
        """One vector per sentence: the mean over its tokens of ``embed(..., layers)``.

        ``[N, 2P]`` for ``"average"`` (default, like TF Hub's ``default`` output),
        ``"top"`` and ``"mix"``; ``[N, L+1, 2P]`` for ``"all"``.  Empty sentences give zeros.
        Other keyword arguments go to :meth:`embed`.
        """
        vectors = self.embed(sentences, layers, **kwargs)
        width = (self.config.output_dim,) if layers != "all" else (self.config.n_output_layers, self.config.output_dim)
        out = np.zeros((len(vectors), *width), np.float32)
        for i, v in enumerate(vectors):
            n = v.shape[-2]
            if n:
                out[i] = v.mean(axis=-2)
        return out

    def embed_groups(
        self,
        sentences: Sequence[Sentence],
        layers: str = "all",
        *,
        batch_size: int | None = None,
        stateful: bool = False,
        progress: bool | None = None,
        mix_params: dict | None = None,
    ) -> Iterator[tuple[list[int], list[np.ndarray]]]:
        """Like :meth:`embed`, but streaming: yields ``(input indices, arrays)`` one padded
        group at a time, so a caller can write results out without holding them all (the
        ``elmo-jax embed`` command does).  While a group is yielded the next one is already
        computing (with ``stateful=True`` its state is already carried)."""
        sentences = _sentence_list(sentences)
        if layers not in LAYER_MODES:
            raise ValueError(f"layers must be one of {', '.join(LAYER_MODES)}, got {layers!r}")
        if layers == "mix":
            mix_params = self._check_mix_params(mix_params)
        elif mix_params is not None:
            raise ValueError('mix_params is only used with layers="mix"')
        token_lists = _token_lists(sentences)
        self._say_truncation(token_lists)
        batch_size = self.batch_size if batch_size is None else batch_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if stateful and batch_size > self.batch_size:
            raise ValueError(
                f"stateful batch_size {batch_size} exceeds the model's batch_size "
                f"{self.batch_size} (the number of carried state rows); create the Elmo "
                f"with a larger batch_size"
            )
        if stateful:
            groups = [list(range(i, min(i + batch_size, len(token_lists))))
                      for i in range(0, len(token_lists), batch_size)]
        else:
            empty = [i for i, t in enumerate(token_lists) if not t]
            if empty:
                shape = (self.config.n_output_layers, 0, self.config.output_dim)
                if layers != "all":
                    shape = shape[1:]
                yield empty, [np.zeros(shape, np.float32) for _ in empty]
            by_bucket: dict[int, list[int]] = {}
            for i in sorted((i for i, t in enumerate(token_lists) if t), key=lambda i: len(token_lists[i])):
                by_bucket.setdefault(time_bucket(len(token_lists[i])), []).append(i)
            groups = [idx[j : j + batch_size] for idx in by_bucket.values()
                      for j in range(0, len(idx), batch_size)]
        show = len(token_lists) > PROGRESS_THRESHOLD if progress is None else bool(progress)
        bar = None
        if show:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(token_lists), unit="sent", desc="embed")
            bar.update(len(token_lists) - sum(len(g) for g in groups))

        def to_host(group: list[int], out: jax.Array) -> list[np.ndarray]:
            host = np.asarray(out)
            return _split_rows(host if layers == "all" else host[None], [len(token_lists[i]) for i in group],
                               squeeze=layers != "all")

        try:
            # One group in flight: the next group is dispatched (jax runs it asynchronously)
            # before this one is copied to the host and sliced, so the device computes
            # while the host copies.
            pending: tuple[list[int], jax.Array] | None = None
            for group in groups + [None]:
                out = None
                if group is not None:
                    out = self._reduce(self._run_group([token_lists[i] for i in group], stateful, batch_size),
                                       layers, mix_params)
                if pending is not None:
                    yield pending[0], to_host(*pending)
                    if bar is not None:
                        bar.update(len(pending[0]))
                pending = None if group is None else (group, out)
        finally:
            if bar is not None:
                bar.close()

    def _check_mix_params(self, mix_params: dict | None) -> dict:
        if mix_params is None:
            raise ValueError(
                'layers="mix" needs mix_params={"scalars": [L+1], "gamma": scalar} '
                "(elmo_jax.model.heads.scalar_mix_init or a trained head)"
            )
        n = self.config.n_output_layers
        if not isinstance(mix_params, dict):
            raise ValueError(f'mix_params must be a dict {{"scalars": [L+1], "gamma": scalar}} '
                             f"(elmo_jax.model.heads.scalar_mix_init or a trained head), got {type(mix_params).__name__}")
        if "scalars" not in mix_params and isinstance(mix_params.get("mix"), dict):
            raise ValueError('mix_params takes the ScalarMix itself: pass result.params["mix"] of a '
                             'trained tagger, not the whole head')
        scalars = np.asarray(mix_params.get("scalars"), np.float32)
        if scalars.shape != (n,):
            raise ValueError(f"mix_params['scalars'] must have shape ({n},), got {scalars.shape}")
        return {"scalars": jnp.asarray(scalars), "gamma": jnp.asarray(mix_params.get("gamma", 1.0), jnp.float32)}

    @staticmethod
    def _reduce(layers_LBTD: jax.Array, layers: str, mix_params: dict | None) -> jax.Array:
        if layers == "all":
            return layers_LBTD
        if layers == "top":
            return layers_LBTD[-1]
        if layers == "average":
            return jnp.mean(layers_LBTD, axis=0)
        return scalar_mix(mix_params, layers_LBTD)

    def _marker_vectors(self) -> tuple[jax.Array, jax.Array]:
        """The ``<S>`` / ``</S>`` vectors, encoded once per parameters (and matmul precision),
        not with every batch: one `small` sentence took 8.5 ms with them in the encoder
        pass, 7.9 ms without (2-core benchmark machine)."""
        leaves = jax.tree.leaves(self.params)
        key = (jax.default_matmul_precision.value, leaves)
        if self._markers is None or self._markers[0][0] != key[0] or not _same_leaves(self._markers[0][1], leaves):
            self._markers = (key, self._encode_markers(self.params, self.config))
        return self._markers[1]

    def _run_group(self, token_lists: list[list[str]], stateful: bool, batch_size: int) -> jax.Array:
        n_rows = row_bucket(len(token_lists), batch_size) if not stateful else batch_size
        n_time = time_bucket(max(len(t) for t in token_lists))
        lengths = np.full((n_rows,), -1, np.int32)
        lengths[: len(token_lists)] = [len(t) for t in token_lists]
        if stateful:
            if self._state is None:
                self._state = zero_state(self.config, self.batch_size)
            state = jax.tree.map(lambda s: s[:, :, :n_rows], self._state)
        else:  # an explicit zero state: stateless and stateful calls share one executable
            if n_rows not in self._zero_states:  # made once per row count (arrays are immutable)
                self._zero_states[n_rows] = zero_state(self.config, n_rows)
            state = self._zero_states[n_rows]
        if self._cache_vectors is not None and not _same_leaves(self._cache_params, jax.tree.leaves(self.params)):
            warnings.warn("elmo.params changed since the token cache was built: the cache belonged to the old "
                          "parameters and was dropped; call cache_vocabulary(...) again for the new ones",
                          stacklevel=4)
            self.clear_token_cache()
        if self._cache_vectors is not None and self._cache_precision in (_ANY_PRECISION,
                                                                         jax.default_matmul_precision.value):
            e = self._token_vectors(token_lists, n_rows, n_time)
            self.compiled_cache_shapes.add(("lstm", n_rows, n_time))
            layers, new_state = self._forward_vectors(self.params, self.config, e, jnp.asarray(lengths), state,
                                                      markers=self._marker_vectors())
        else:
            ids = np.zeros((n_rows, n_time, self.config.token_id_width), np.int32)
            ids[: len(token_lists)] = self.token_ids.batch_to_ids(token_lists, max_length=n_time)
            self.compiled_shapes.add((n_rows, n_time))
            layers, new_state = self._forward(self.params, self.config, ids, state, lengths,
                                              markers=self._marker_vectors())
        if stateful:
            self._state = jax.tree.map(
                lambda old, new: old.at[:, :, :n_rows].set(new), self._state, new_state
            )
        return layers

    # -- context-free token-vector cache ------------------------------------------------
    @property
    def token_cache(self) -> tuple[list[str], np.ndarray] | None:
        """``(words, vectors [n_vocab, P])`` of the active cache, or ``None``."""
        if self._cache_vectors is None:
            return None
        return list(self._cache_words), self._cache_vectors

    def cache_vocabulary(self, tokens: Sequence[str], batch_size: int = 1024) -> np.ndarray:
        """Compute and keep the context-free vectors ``[n_vocab, P]`` of ``tokens``.

        Row ``i`` is the char CNN's vector of ``tokens[i]`` (what layer 0 holds in each
        half).  Later :meth:`embed` calls look these words up instead of running the CNN.
        Repeated tokens are allowed (the first occurrence is used for look-ups).  The
        vectors belong to the matmul precision they were computed under
        (``jax.default_matmul_precision``; it matters on GPUs and TPUs): calls under another
        precision run the char CNN instead, so that their results stay those of that
        precision.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        words = self._check_vocab(tokens)
        self._say_truncation([words])
        vectors = np.zeros((len(words), self.config.projection_dim), np.float32)
        for start in range(0, len(words), batch_size):
            chunk = words[start : start + batch_size]
            vectors[start : start + len(chunk)] = self._encode_words(chunk, self.config.token_id_width)
        self._set_cache(words, vectors, jax.default_matmul_precision.value)
        return vectors

    def save_token_cache(self, path: str | os.PathLike) -> None:
        """Write the active cache as HDF5: one dataset ``embedding`` ``[n_vocab, P]``
        (the word list is not stored: keep the vocabulary file that produced it)."""
        if self._cache_vectors is None:
            raise ElmoError("no token cache: call cache_vocabulary(tokens) first")
        refuse_output_over_inputs(path, {role: f for role, f in self.source_files.items() if role != "token cache"})
        with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
            f.create_dataset("embedding", data=self._cache_vectors)

    def load_token_cache(self, path: str | os.PathLike, vocab: Sequence[str] | str | os.PathLike) -> None:
        """Use a cache file written by :meth:`save_token_cache` (or the originals'
        ``dump_token_embeddings``) whose rows belong to ``vocab``: a list of tokens or a
        vocabulary file (one token per line, UTF-8, read as the originals read it: stripped,
        ``!!!MAXTERMID`` skipped).  The vectors are used as they are, whatever matmul
        precision later calls run under."""
        if isinstance(vocab, (str, os.PathLike)):
            vocab = [tok for _, tok in read_token_lines(vocab)]
        words = self._check_vocab(vocab)
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"token cache file not found: {path}")
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            damage = hdf5_damage(path, e)
            if damage:
                raise ElmoError(f"{path} {damage}; copy the token cache again, or rebuild it with "
                                f"cache_vocabulary + save_token_cache") from None
            raise ElmoError(f"{path} is not a readable HDF5 token cache ({e}); the cache is the .hdf5 "
                            f"file, the vocabulary the text file") from None
        with f:
            if "embedding" not in f:
                raise ElmoError(f"{path} has no dataset 'embedding' (found: {', '.join(f.keys()) or 'nothing'})")
            vectors = np.asarray(f["embedding"][...], np.float32)
        expected = (len(words), self.config.projection_dim)
        if vectors.shape != expected:
            raise ElmoError(
                f"{path}: 'embedding' has shape {vectors.shape}, expected {expected} "
                f"({len(words)} vocabulary words x projection_dim {self.config.projection_dim})"
            )
        self._set_cache(words, vectors, _ANY_PRECISION)
        self.source_files["token cache"] = os.path.abspath(path)

    def clear_token_cache(self) -> None:
        """Go back to running the char CNN for every token."""
        self._cache_words, self._cache_index, self._cache_vectors = None, {}, None
        self._cache_precision = _ANY_PRECISION
        self._cache_params = []

    def _say_truncation(self, token_lists: list[list[str]]) -> None:
        """Warn, once per object, that tokens longer than the char CNN reads are cut."""
        if self._truncation_said:
            return
        message = self.token_ids.truncation_message(token_lists)
        if message:
            self._truncation_said = True
            warnings.warn(message, chars.TokenTruncatedWarning, stacklevel=4)

    @staticmethod
    def _check_vocab(tokens: Sequence[str]) -> list[str]:
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

    def _set_cache(self, words: list[str], vectors: np.ndarray, precision: object) -> None:
        """``precision``: the matmul precision the vectors were computed under (``None`` is
        JAX's default), or ``_ANY_PRECISION`` for vectors from a file."""
        index: dict[str, int] = {}
        for i, w in enumerate(words):
            index.setdefault(w, i)
        self._cache_words, self._cache_index, self._cache_vectors = words, index, vectors
        self._cache_precision = precision
        self._cache_params = jax.tree.leaves(self.params)

    def _encode_words(self, words: Sequence[str], n_chars: int) -> np.ndarray:
        """Token vectors of ``words``; ``n_chars``: the ids per token (``config.token_id_width``)."""
        n = _encoder_bucket(len(words))
        ids = np.zeros((n, n_chars), np.int32)
        ids[: len(words)] = self.token_ids.tokens_to_ids(words)
        self.compiled_cache_shapes.add(("encoder", n))
        return np.asarray(self._encode(self.params, self.config, ids))[: len(words)]

    def _token_vectors(self, token_lists: list[list[str]], n_rows: int, n_time: int) -> np.ndarray:
        """``[rows, time, P]``: cached words looked up, the group's other words encoded once."""
        cache = self._cache_vectors
        extra: dict[str, int] = {}
        idx = np.zeros((n_rows, n_time), np.int64)
        for r, tokens in enumerate(token_lists):
            for t, w in enumerate(tokens):
                k = self._cache_index.get(w)
                if k is None:
                    k = extra.setdefault(w, len(cache) + len(extra))
                idx[r, t] = k
        if extra:
            new = self._encode_words(list(extra), self.config.token_id_width)
            table = np.concatenate([cache, new])
        else:
            table = cache
        return table[idx]


def _sentence_list(sentences: Sequence[Sentence]) -> list[Sentence]:
    """``embed``'s argument as a list, or a TypeError that says what it takes."""
    if isinstance(sentences, (str, bytes)):
        raise TypeError("embed() takes a list of sentences; wrap a single sentence as [sentence]")
    try:
        return list(sentences)
    except TypeError:
        raise TypeError(f"embed() takes a list of sentences (strings, or lists of str tokens), got "
                        f"{type(sentences).__name__}: {sentences!r:.80}") from None


def _token_lists(sentences: list[Sentence]) -> list[list[str]]:
    """Each sentence as a token list; an error names the sentence's index.  An empty-string
    token is refused: it would be embedded as a word with no characters."""
    out = []
    for i, sentence in enumerate(sentences):
        try:
            tokens = chars.tokenize(sentence)
        except TypeError as e:
            raise TypeError(f"sentence {i}: {e}") from None
        if not all(tokens):
            raise ValueError(
                f"sentence {i}: token {[bool(t) for t in tokens].index(False)} is an empty string: a token needs "
                f"at least one character (splitting a string sentence never gives one); drop empty strings "
                f"from the token list")
        out.append(tokens)
    return out


def _same_leaves(a: list, b: list) -> bool:
    """Whether two lists of parameter leaves are the very same arrays (parameters are
    immutable, so identity means the same values)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _split_rows(host_LBTD: np.ndarray, lengths: list[int], squeeze: bool) -> list[np.ndarray]:
    """Row ``r``'s first ``lengths[r]`` steps as its own C-contiguous ``[L, n, D]`` array
    (``[n, D]`` if ``squeeze``).  The arrays are slices of one buffer per group: a fresh
    allocation per sentence made every page of every sentence fault on first write
    (7-30 us per `original` token on the 2-core machine, against ~2 us this way)."""
    n_layers, _, _, dim = host_LBTD.shape
    per_step = n_layers * dim
    buf = np.empty(sum(lengths) * per_step, host_LBTD.dtype)
    out, start = [], 0
    for r, n in enumerate(lengths):
        a = buf[start : start + n * per_step].reshape(n_layers, n, dim)
        np.copyto(a, host_LBTD[:, r, :n])
        out.append(a[0] if squeeze else a)
        start += n * per_step
    return out


def _find_file(model_dir: str, preferred_name: str, keyword: str, suffix: str) -> str:
    preferred = os.path.join(model_dir, preferred_name)
    if os.path.exists(preferred):
        return preferred
    candidates = sorted(f for f in os.listdir(model_dir) if f.endswith(suffix) and keyword in f)
    if len(candidates) == 1:
        return os.path.join(model_dir, candidates[0])
    if not candidates:
        raise FileNotFoundError(
            f"{model_dir} has no {preferred_name} (nor another *{keyword}*{suffix} file); "
            f"a model folder holds {OPTIONS_FILE} and {WEIGHTS_FILE}"
        )
    raise FileNotFoundError(
        f"{model_dir} has several {keyword} files ({', '.join(candidates)}) and no "
        f"{preferred_name}; pass {'options_file' if keyword == 'options' else 'weight_file'}= explicitly"
    )


__all__ = ["Elmo", "ConfigError", "time_bucket", "time_buckets", "row_bucket", "scan_length_bucket"]
