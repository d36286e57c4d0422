"""``Elmo``: load a model, embed sentences, save it — the notebook entry point.

(About 500 lines: the facade over :mod:`elmo_jax.embedding`'s pieces, and its docstrings.)

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

Devices
-------
``Elmo(..., devices=None)`` (and ``Elmo.load``) computes on every local device of the default
backend (``jax.local_devices()``; an int takes the first ``n``, a list those devices):
``elmo.devices``.  The parameters are replicated once over a 1-D mesh (``elmo.mesh``, axis
``rows``) and the rows of each padded group are split over it, so row buckets are rounded up
to multiples of the device count (``row_bucket(n, batch_size, n_devices)``); the results are
those of one device (to float rounding).  While the devices run a group, a host thread
prepares the next ones (char ids, padding; :mod:`elmo_jax.embedding.host`), and a group's
outputs are copied back only once the next group is dispatched.

The pieces live in :mod:`elmo_jax.embedding` (buckets, host preparation, devices, compiled
programs, LSTM state, token cache, outputs); ``Elmo`` composes them.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from elmo_jax import chars
from elmo_jax.atomic import atomic_path, refuse_output_over_inputs
from elmo_jax.config import ConfigError, ElmoConfig
from elmo_jax.data.vocab import read_token_lines
from elmo_jax.embedding.buckets import (
    MIN_ENCODER_TOKENS,
    MIN_SCAN_LENGTH,
    N_MARKERS,
    encoder_bucket,
    n_row_buckets,
    round_to_devices,
    row_bucket,
    scan_length_bucket,
    time_bucket,
    time_buckets,
)
from elmo_jax.embedding.devices import Devices, Placement
from elmo_jax.embedding.host import (
    CacheRows,
    CallTokens,
    Group,
    Sentence,
    maybe_ahead,
    plan_groups,
    prepare_group,
    sentence_list,
    token_lists,
)
from elmo_jax.embedding.outputs import LAYER_MODES, check_layers, empty_outputs, reduce_layers, split_rows
from elmo_jax.embedding.programs import Programs
from elmo_jax.embedding.state import LstmStates
from elmo_jax.embedding.token_cache import ANY_PRECISION, TokenCache, check_vocab, current_precision, read_cache_vectors
from elmo_jax.errors import ElmoError
from elmo_jax.model.bilm import init_params
from elmo_jax.model.precision import compute_dtype
from elmo_jax.formats.folder import read_files
from elmo_jax.formats.hdf5 import OPTIONS_FILE, WEIGHTS_FILE, save_weights

# Above this many sentences, ``embed(progress=None)`` shows a progress bar.
PROGRESS_THRESHOLD = 1000
# How many groups the host thread prepares ahead of the devices.
LOOK_AHEAD = 4


class Elmo:
    """A biLM with its parameters, ready to embed text.

    Deterministic by default: every call starts from the zero LSTM state.  With
    ``embed(..., stateful=True)`` the state is carried from call to call (row ``i`` of a
    batch continues row ``i`` of the previous one), the originals' behaviour;
    :meth:`reset_state` forgets it.  ``devices``: ``None`` (every local device), a count
    (the first ``n``) or a list of devices; see "Devices" in :mod:`elmo_jax.embedding.embedder`.
    """

    def __init__(
        self,
        config: ElmoConfig,
        params: dict,
        batch_size: int = 64,
        dtype: str = "float32",
        devices: Devices = None,
        token_ids=None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if token_ids is None and config.vocab is not None:
            raise ValueError(
                "a vocabulary model (config.vocab) needs token_ids=VocabIds(...) from its .dic files; "
                "Elmo.load(folder) reads them"
            )
        # Tokens -> ids: UTF-8 bytes, or a vocabulary model's char.dic / word.dic (manylangs.VocabIds).
        # Any: the caller's object is duck-typed (a vocabulary model's also saves its .dic files).
        self.token_ids: Any = token_ids or chars.ByteIds(config.char_cnn.max_characters_per_token)
        self.config = config
        self.batch_size = batch_size
        # "bfloat16": matmul operands in bf16, params, cell state, accumulation and outputs
        # float32 (outputs within ~1e-2 relative of float32; see README "Speed").
        self.dtype = compute_dtype(dtype)
        self._placement = Placement(devices)
        self.params = params
        self._programs = Programs(self.dtype)
        # Attributes (not methods) so that a caller can wrap them: the tests count calls.
        self._forward = self._programs.forward
        self._forward_vectors = self._programs.forward_vectors
        self._encode = self._programs.encode
        self._states = LstmStates(config, self._placement, round_to_devices(batch_size, self._placement.n_devices))
        self._cache: TokenCache | None = None
        # The files this model was read from ({role: absolute path}): outputs never replace them.
        self.source_files: dict[str, str] = {}
        self._truncation_said = False  # the over-long-token warning is given once per object

    # -- parameters and devices ---------------------------------------------------------
    @property
    def params(self) -> dict:
        """The biLM's parameters, replicated over :attr:`devices`; assigning new ones places them."""
        return self._params

    @params.setter
    def params(self, params: dict) -> None:
        self._params = self._placement.put_replicated(params)

    @property
    def devices(self) -> list[jax.Device]:
        """The devices this model computes on."""
        return list(self._placement.devices)

    @property
    def mesh(self) -> jax.sharding.Mesh:
        """The 1-D mesh (axis ``"rows"``) over :attr:`devices`."""
        return self._placement.mesh

    def put_rows(self, tree, axis: int = 0):
        """``tree``'s arrays split by rows (``axis``) over :attr:`devices`, as a task model
        shards its batch (the row count must be a multiple of ``len(elmo.devices)``)."""
        return self._placement.put_rows(tree, axis)

    @property
    def compiled_shapes(self) -> set[tuple[int, int]]:
        return self._programs.compiled_shapes

    @property
    def compiled_cache_shapes(self) -> set:
        return self._programs.compiled_cache_shapes

    def _marker_vectors(self) -> tuple[jax.Array, jax.Array]:
        """The ``<S>`` / ``</S>`` vectors of the current parameters (encoded once)."""
        return self._programs.markers(self.params, self.config)

    @property
    def _markers(self):
        """What the ``<S>`` / ``</S>`` vectors are kept as (the tests check they are reused)."""
        return self._programs._markers

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
        devices: Devices = None,
        progress: bool = True,
    ) -> "Elmo":
        """From a folder or from the two files.

        A folder holds ``options.json`` + ``weights.hdf5`` (what :meth:`save` and
        ``elmo-jax export`` write; other files beside them, such as an export's
        ``vocab.txt`` and ``softmax.hdf5``, are ignored).  Folders of the released models,
        with one ``*options*.json`` and one ``*weights*.hdf5`` under other names, load too.
        ``model_dir`` may also be a released model's name (``"original"``) or an http(s)
        URL: :func:`elmo_jax.resolve.resolve_model` downloads it once into the cache; or a
        training workdir: its newest checkpoint, exported once into the cache
        (:mod:`elmo_jax.formats.run_exports`).  ``progress=False`` turns the download's progress
        bar off.  A folder of HIT-SCIR's ELMoForManyLangs (``config.json``, ``char.dic``,
        ``word.dic``, ``*.pkl``) is converted once into the model cache
        (:mod:`elmo_jax.formats.manylangs`) and read from there.
        Raises ``FileNotFoundError`` naming a missing file and
        :class:`elmo_jax.formats.hdf5.WeightFileError` naming the first dataset that does not
        fit the options.  ``devices``: as for :class:`Elmo`.
        """
        if model_dir is not None:
            if options_file is not None or weight_file is not None:
                raise ValueError("give either model_dir or options_file + weight_file, not both")
            from elmo_jax.resolve import read_model

            model = read_model(model_dir, progress=progress)
        elif options_file is None or weight_file is None:
            raise ValueError("Elmo.load needs model_dir, or both options_file and weight_file")
        else:
            model = read_files(options_file, weight_file)
        elmo = cls(
            model.config, model.params, batch_size=batch_size, dtype=dtype, token_ids=model.token_ids, devices=devices
        )
        elmo.source_files = {"model's options file": model.options_file, "model's weight file": model.weight_file}
        return elmo

    @classmethod
    def random(
        cls,
        config: ElmoConfig | str = "tiny",
        seed: int = 0,
        batch_size: int = 64,
        dtype: str = "float32",
        devices: Devices = None,
    ) -> "Elmo":
        """A randomly initialised model (a preset name or an ``ElmoConfig``)."""
        if isinstance(config, str):
            config = ElmoConfig.preset(config)
        return cls(
            config, init_params(jax.random.key(seed), config), batch_size=batch_size, dtype=dtype, devices=devices
        )

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
            raise FileExistsError(f"{', '.join(existing)} already exist(s); pass overwrite=True to replace")
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
        self._states.reset()

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
        sentences = sentence_list(sentences)
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
        computing (with ``stateful=True`` its state is already carried), and a host thread
        prepares the groups after it."""
        sentences = sentence_list(sentences)
        mix = check_layers(layers, mix_params, self.config.n_output_layers)
        toks = token_lists(sentences)
        self._say_truncation(toks)
        batch_size = self.batch_size if batch_size is None else batch_size
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if stateful and batch_size > self.batch_size:
            raise ValueError(
                f"stateful batch_size {batch_size} exceeds the model's batch_size "
                f"{self.batch_size} (the number of carried state rows); create the Elmo "
                f"with a larger batch_size"
            )
        lengths = [len(t) for t in toks]
        plans = plan_groups(lengths, batch_size, stateful=stateful, n_devices=self._placement.n_devices)
        if not stateful:
            empty = [i for i, n in enumerate(lengths) if not n]
            if empty:
                yield empty, empty_outputs(len(empty), layers, self.config.n_output_layers, self.config.output_dim)
        show = len(toks) > PROGRESS_THRESHOLD if progress is None else bool(progress)
        bar = None
        if show:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(toks), unit="sent", desc="embed")
            bar.update(len(toks) - sum(len(p.indices) for p in plans))
        if not plans:
            if bar is not None:
                bar.close()
            return
        cache = self._usable_cache()
        tokens = CallTokens(toks, self.config.token_id_width, self.token_ids.tokens_to_ids)
        cache_rows = None if cache is None else CacheRows.build(tokens, cache.index, len(cache.vectors))
        prepared = maybe_ahead(plans, lambda plan: prepare_group(tokens, plan, cache_rows), LOOK_AHEAD)

        def to_host(group: Group, out: jax.Array) -> list[np.ndarray]:
            host = np.asarray(out)
            return split_rows(
                host if layers == "all" else host[None],
                [lengths[i] for i in group.plan.indices],
                squeeze=layers != "all",
            )

        try:
            # One group in flight: the next group is dispatched (jax runs it asynchronously)
            # before this one is copied to the host and sliced, so the devices compute
            # while the host copies.
            pending: tuple[Group, jax.Array] | None = None
            for group in itertools.chain(prepared, [None]):
                dispatched = None
                if group is not None:
                    dispatched = (group, reduce_layers(self._run_group(group, stateful, cache), layers, mix))
                if pending is not None:
                    yield pending[0].plan.indices, to_host(*pending)
                    if bar is not None:
                        bar.update(len(pending[0].plan.indices))
                pending = dispatched
        finally:
            prepared.close()
            if bar is not None:
                bar.close()

    def _usable_cache(self) -> TokenCache | None:
        """The token cache, if this call may use it (it belongs to the current parameters and
        serves the current matmul precision)."""
        if self._cache is None:
            return None
        if not self._cache.belongs_to(jax.tree.leaves(self.params)):
            warnings.warn(
                "elmo.params changed since the token cache was built: the cache belonged to the old "
                "parameters and was dropped; call cache_vocabulary(...) again for the new ones",
                stacklevel=4,
            )
            self.clear_token_cache()
            return None
        return self._cache if self._cache.serves(current_precision()) else None

    def _run_group(self, group: Group, stateful: bool, cache: TokenCache | None) -> jax.Array:
        """Dispatch one prepared group on the devices: layers ``[L+1, R, T, 2P]``."""
        n_rows, n_time = group.plan.n_rows, group.plan.n_time
        state = self._states.start(n_rows, stateful)
        lengths = self._placement.put_rows(group.lengths_R)
        markers = self._marker_vectors()
        if group.char_ids_RTC is None:
            assert cache is not None  # the group was prepared with rows of the token cache
            table = cache.vectors
            if group.extra_words:
                new = self._encode_words(group.extra_words, self.config.token_id_width)
                table = np.concatenate([table, new])
            e = self._placement.put_rows(table[group.cache_rows_RT])
            self.compiled_cache_shapes.add(("lstm", n_rows, n_time))
            layers, new_state = self._forward_vectors(self.params, self.config, e, lengths, state, markers=markers)
        else:
            ids = self._placement.put_rows(group.char_ids_RTC)
            self.compiled_shapes.add((n_rows, n_time))
            layers, new_state = self._forward(self.params, self.config, ids, state, lengths, markers=markers)
        if stateful:
            self._states.carry(n_rows, new_state)
        return layers

    # -- context-free token-vector cache ------------------------------------------------
    @property
    def token_cache(self) -> tuple[list[str], np.ndarray] | None:
        """``(words, vectors [n_vocab, P])`` of the active cache, or ``None``."""
        if self._cache is None:
            return None
        return list(self._cache.words), self._cache.vectors

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
        words = check_vocab(tokens)
        self._say_truncation([words])
        vectors = np.zeros((len(words), self.config.projection_dim), np.float32)
        for start in range(0, len(words), batch_size):
            chunk = words[start : start + batch_size]
            vectors[start : start + len(chunk)] = self._encode_words(chunk, self.config.token_id_width)
        self._cache = TokenCache(words, vectors, current_precision(), jax.tree.leaves(self.params))
        return vectors

    def save_token_cache(self, path: str | os.PathLike) -> None:
        """Write the active cache as HDF5: one dataset ``embedding`` ``[n_vocab, P]``
        (the word list is not stored: keep the vocabulary file that produced it)."""
        if self._cache is None:
            raise ElmoError("no token cache: call cache_vocabulary(tokens) first")
        refuse_output_over_inputs(path, {role: f for role, f in self.source_files.items() if role != "token cache"})
        self._cache.save(path)

    def load_token_cache(self, path: str | os.PathLike, vocab: Sequence[str] | str | os.PathLike) -> None:
        """Use a cache file written by :meth:`save_token_cache` (or the originals'
        ``dump_token_embeddings``) whose rows belong to ``vocab``: a list of tokens or a
        vocabulary file (one token per line, UTF-8, read as the originals read it: stripped,
        ``!!!MAXTERMID`` skipped).  The vectors are used as they are, whatever matmul
        precision later calls run under."""
        if isinstance(vocab, (str, os.PathLike)):
            vocab = [tok for _, tok in read_token_lines(vocab)]
        words = check_vocab(vocab)
        vectors = read_cache_vectors(path, len(words), self.config.projection_dim)
        self._cache = TokenCache(words, vectors, ANY_PRECISION, jax.tree.leaves(self.params))
        self.source_files["token cache"] = os.path.abspath(path)

    def clear_token_cache(self) -> None:
        """Go back to running the char CNN for every token."""
        self._cache = None

    def _say_truncation(self, token_lists: list[list[str]]) -> None:
        """Warn, once per object, that tokens longer than the char CNN reads are cut."""
        if self._truncation_said:
            return
        message = self.token_ids.truncation_message(token_lists)
        if message:
            self._truncation_said = True
            warnings.warn(message, chars.TokenTruncatedWarning, stacklevel=4)

    def _encode_words(self, words: Sequence[str], n_chars: int) -> np.ndarray:
        """The char CNN's vectors ``[len(words), P]`` (padded to :func:`encoder_bucket` words;
        replicated over the devices: a one-off per vocabulary or group)."""
        n = encoder_bucket(len(words))
        ids = np.zeros((n, n_chars), np.int32)
        ids[: len(words)] = self.token_ids.tokens_to_ids(words)
        self.compiled_cache_shapes.add(("encoder", n))
        return np.asarray(self._encode(self.params, self.config, ids))[: len(words)]


__all__ = [
    "Elmo",
    "ConfigError",
    "time_bucket",
    "time_buckets",
    "row_bucket",
    "scan_length_bucket",
    "n_row_buckets",
    "LAYER_MODES",
    "MIN_SCAN_LENGTH",
    "N_MARKERS",
    "MIN_ENCODER_TOKENS",
    "Sentence",
]
