"""The biLM's architecture: an immutable config, presets, and ``options.json`` I/O.

``options.json`` is read and written exactly as the released ELMo models spell it::

    {"lstm": {"dim", "projection_dim", "n_layers", "cell_clip", "proj_clip",
              "use_skip_connections"},
     "char_cnn": {"embedding": {"dim"}, "filters", "n_highway", "n_characters",
                  "max_characters_per_token", "activation"}}

``n_characters`` may be 261 (the training-time table) or 262 (the inference table with a
padding row); both describe the same model.  This package always runs the 262 form.

Models whose tokens are read through vocabulary files instead of UTF-8 bytes (HIT-SCIR's
ELMoForManyLangs, converted by :mod:`elmo_jax.formats.manylangs`) add a ``vocab`` section
(:class:`VocabConfig`): a char table of ``char.dic``'s size (+1 padding row), and optionally
a word table whose vectors are concatenated with the char CNN + highway output before the
projection.  Their token ids are ``[word id, char ids ...]`` (width ``1 + C``, see
:attr:`ElmoConfig.token_id_width`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from elmo_jax import chars
from elmo_jax.atomic import write_json
from elmo_jax.errors import ElmoError
from elmo_jax.textio import HDF5_SIGNATURE

ACTIVATIONS = ("relu", "tanh")
# Matmul operand dtypes (params, cell state and accumulation stay float32).
COMPUTE_DTYPES = ("float32", "bfloat16")
STANDARD_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


class ConfigError(ElmoError, ValueError):
    """An options.json or config value that cannot describe a biLM."""


@dataclasses.dataclass(frozen=True)
class CharCNNConfig:
    embedding_dim: int = 16
    filters: tuple[tuple[int, int], ...] = STANDARD_FILTERS
    n_highway: int = 2
    activation: str = "relu"
    max_characters_per_token: int = 50
    n_characters: int = chars.N_CHARS

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
    dim: int = 4096
    projection_dim: int = 512
    n_layers: int = 2
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True


CHAR_ROLES = ("begin", "end", "bos", "eos", "oov", "pad")
WORD_ROLES = ("bos", "eos", "oov", "pad")


@dataclasses.dataclass(frozen=True)
class VocabConfig:
    """Token inputs through vocabulary files (``char.dic``, ``word.dic``) instead of bytes.

    ``char_ids``: the ``char.dic`` ids (as the file numbers them) of the char that begins
    every word, the one that ends it, the chars of the ``<bos>`` / ``<eos>`` marker tokens,
    unknown chars and padding (:data:`CHAR_ROLES` order).  ``word_ids``: the ``word.dic``
    ids of ``<bos>``, ``<eos>``, unknown words and padding (:data:`WORD_ROLES`); empty
    when ``word_dim`` is 0 (no word table).  At run time every id is shifted by +1, so that
    0 means "no token" as for byte models.
    """

    n_chars: int
    char_ids: tuple[int, ...]
    n_words: int = 0
    word_dim: int = 0
    word_ids: tuple[int, ...] = ()

    def to_options(self) -> dict:
        out: dict[str, Any] = {
            "n_chars": self.n_chars,
            "char_ids": dict(zip(CHAR_ROLES, self.char_ids)),
            "word_dim": self.word_dim,
        }
        if self.word_dim:
            out.update(n_words=self.n_words, word_ids=dict(zip(WORD_ROLES, self.word_ids)))
        return out

    @classmethod
    def from_options(cls, d: Any, source: str) -> "VocabConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: vocab must be an object, got {type(d).__name__}")

        def ids(key: str, roles: tuple[str, ...]) -> tuple[int, ...]:
            section = _section(d, key, source, prefix="vocab.")
            return tuple(_field(section, r, int, source, f"vocab.{key}.") for r in roles)

        word_dim = _field(d, "word_dim", int, source, "vocab.", default=0)
        return cls(
            n_chars=_field(d, "n_chars", int, source, "vocab."),
            char_ids=ids("char_ids", CHAR_ROLES),
            n_words=_field(d, "n_words", int, source, "vocab.") if word_dim else 0,
            word_dim=word_dim,
            word_ids=ids("word_ids", WORD_ROLES) if word_dim else (),
        )

    def marker_rows(self, max_characters_per_token: int) -> list[list[int]]:
        """Token ids (+1 shifted, ``[word id, chars ...]``) of ``<bos>`` and ``<eos>``:
        begin char, the marker's char, end char, padding."""
        begin, end, bos, eos, _, pad = (i + 1 for i in self.char_ids)
        rows = []
        for n, char in enumerate((bos, eos)):
            word = self.word_ids[n] + 1 if self.word_dim else 0
            rows.append([word, begin, char, end] + [pad] * (max_characters_per_token - 3))
        return rows


@dataclasses.dataclass(frozen=True)
class ElmoConfig:
    """Architecture of a biLM (char-CNN token encoder + two projected-LSTM stacks).

    Hashable, so it can be a static argument of ``jax.jit``.
    """

    char_cnn: CharCNNConfig = CharCNNConfig()
    lstm: LSTMConfig = LSTMConfig()
    vocab: VocabConfig | None = None  # None: UTF-8 byte ids (every bilm-tf / AllenNLP model)

    def __post_init__(self):
        _validate(self)

    # -- derived sizes ---------------------------------------------------------------
    @property
    def projection_dim(self) -> int:
        return self.lstm.projection_dim

    @property
    def output_dim(self) -> int:
        """Width of every output layer: forward and backward halves, ``2 * projection_dim``."""
        return 2 * self.lstm.projection_dim

    @property
    def n_output_layers(self) -> int:
        """Token layer + one per LSTM layer."""
        return self.lstm.n_layers + 1

    @property
    def word_dim(self) -> int:
        """Width of the word table concatenated before the projection (0: none)."""
        return self.vocab.word_dim if self.vocab is not None else 0

    @property
    def projection_input_dim(self) -> int:
        """What the projection reads: the word vector (if any), then the char CNN's ``F``."""
        return self.word_dim + self.char_cnn.n_filters

    @property
    def has_char_projection(self) -> bool:
        """Whether a projection ``[W + F] -> [P]`` follows the highway layers.  The byte models
        (bilm-tf) have one only when the widths differ; a vocabulary model (ELMoForManyLangs)
        always has one, as that package builds it, equal widths included."""
        return self.vocab is not None or self.projection_input_dim != self.lstm.projection_dim

    @property
    def token_id_width(self) -> int:
        """Ids per token: ``C`` chars, plus the word id in front for vocabulary models."""
        return self.char_cnn.max_characters_per_token + (self.vocab is not None)

    # -- presets ---------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "ElmoConfig":
        """``original``, ``medium``, ``small`` (the released models) or ``tiny`` (tests)."""
        try:
            return PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None

    def replace(self, **changes: Any) -> "ElmoConfig":
        """A copy with ``char_cnn`` / ``lstm`` fields replaced, e.g. ``replace(dim=64)``."""
        cnn_fields = {f.name for f in dataclasses.fields(CharCNNConfig)}
        lstm_fields = {f.name for f in dataclasses.fields(LSTMConfig)}
        unknown = set(changes) - cnn_fields - lstm_fields
        if unknown:
            raise ConfigError(
                f"unknown ElmoConfig field(s) {sorted(unknown)}; valid: {sorted(cnn_fields | lstm_fields)}"
            )
        if "filters" in changes:
            changes["filters"] = _filter_pairs(changes["filters"], "filters")
        cnn = dataclasses.replace(self.char_cnn, **{k: v for k, v in changes.items() if k in cnn_fields})
        lstm = dataclasses.replace(self.lstm, **{k: v for k, v in changes.items() if k in lstm_fields})
        return ElmoConfig(char_cnn=cnn, lstm=lstm, vocab=self.vocab)

    # -- options.json ----------------------------------------------------------------
    def to_options(self) -> dict:
        c, l = self.char_cnn, self.lstm
        lstm: dict[str, Any] = {
            "dim": l.dim,
            "projection_dim": l.projection_dim,
            "n_layers": l.n_layers,
            "use_skip_connections": l.use_skip_connections,
        }
        # Always written (null when unclipped): AllenNLP's reader indexes both keys.
        lstm["cell_clip"] = None if l.cell_clip is None else _number(l.cell_clip)
        lstm["proj_clip"] = None if l.proj_clip is None else _number(l.proj_clip)
        out = {
            "lstm": lstm,
            "char_cnn": {
                "embedding": {"dim": c.embedding_dim},
                "filters": [[w, n] for w, n in c.filters],
                "n_highway": c.n_highway,
                # The inference table's size, whichever form this config was built with: a
                # file saying 261 next to a 262-row table is what trips other readers up.
                "n_characters": chars.N_CHARS if self.vocab is None else c.n_characters,
                "max_characters_per_token": c.max_characters_per_token,
                "activation": c.activation,
            },
        }
        if self.vocab is not None:
            out["vocab"] = self.vocab.to_options()
        return out

    @classmethod
    def from_options(cls, options: dict, source: str = "options.json") -> "ElmoConfig":
        """Parse the released models' options dict; errors name the field and the fix."""
        if not isinstance(options, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(options).__name__}")
        lstm = _section(options, "lstm", source)
        cnn = _section(options, "char_cnn", source)
        emb = _section(cnn, "embedding", source, prefix="char_cnn.")
        filters = _filter_pairs(_field(cnn, "filters", list, source, "char_cnn."), f"{source}: char_cnn.filters")
        vocab = VocabConfig.from_options(options["vocab"], source) if "vocab" in options else None
        n_chars = _field(cnn, "n_characters", int, source, "char_cnn.", default=chars.N_CHARS)
        if vocab is None and n_chars not in (chars.N_RAW_CHARS, chars.N_CHARS):
            raise ConfigError(
                f"{source}: char_cnn.n_characters is {n_chars}; ELMo models use 261 (training) "
                f"or 262 (inference, with a padding row)"
            )
        try:
            return cls._from_fields(cnn, emb, lstm, filters, source, vocab)
        except ConfigError as e:  # a range check of __post_init__ does not know the file: add it
            message = str(e)
            raise ConfigError(message if message.startswith(f"{source}:") else f"{source}: {message}") from None

    @classmethod
    def _from_fields(
        cls, cnn: dict, emb: dict, lstm: dict, filters, source: str, vocab: VocabConfig | None = None
    ) -> "ElmoConfig":
        return cls(
            char_cnn=CharCNNConfig(
                embedding_dim=_field(emb, "dim", int, source, "char_cnn.embedding."),
                filters=filters,
                # Optional as in the original reader: absent = no highway layer, one LSTM
                # layer.  load_weights refuses a weight file with layers these leave out.
                n_highway=_field(cnn, "n_highway", int, source, "char_cnn.", default=0),
                activation=_field(cnn, "activation", str, source, "char_cnn."),
                max_characters_per_token=_field(cnn, "max_characters_per_token", int, source, "char_cnn."),
                # 261 and 262 describe the same model; the run-time table always has 262 rows.
                n_characters=chars.N_CHARS if vocab is None else vocab.n_chars + 1,
            ),
            lstm=LSTMConfig(
                dim=_field(lstm, "dim", int, source, "lstm."),
                projection_dim=_field(lstm, "projection_dim", int, source, "lstm."),
                n_layers=_field(lstm, "n_layers", int, source, "lstm.", default=1),
                cell_clip=_optional_number(lstm, "cell_clip", source),
                proj_clip=_optional_number(lstm, "proj_clip", source),
                use_skip_connections=_field(lstm, "use_skip_connections", bool, source, "lstm."),
            ),
            vocab=vocab,
        )

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "ElmoConfig":
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise ConfigError(f"options file not found: {path}") from None
        except OSError as e:
            raise ConfigError(f"cannot read options file {path} ({e.strerror})") from None
        if raw.startswith(HDF5_SIGNATURE):
            raise ConfigError(f"{path} is an HDF5 file, not options.json: were the options and weight files swapped?")
        try:
            options = json.loads(raw.decode("utf-8-sig"))
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); options.json must be a UTF-8 JSON file"
            ) from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        return cls.from_options(options, source=path)

    def to_json_file(self, path: str | os.PathLike) -> None:
        """Write ``options.json`` (atomically)."""
        write_json(path, self.to_options())


def count_params(config: ElmoConfig) -> int:
    """Trainable parameters of the biLM, softmax excluded, as the released models count them.

    The char table counts its 261 trainable rows (the padding row is a constant zero).
    """
    c, l = config.char_cnn, config.lstm
    n = (c.n_characters - 1 if config.vocab is not None else chars.N_RAW_CHARS) * c.embedding_dim
    if config.word_dim:
        assert config.vocab is not None  # word_dim is 0 without one
        n += config.vocab.n_words * config.word_dim
    n += sum(w * c.embedding_dim * k + k for w, k in c.filters)
    f = c.n_filters
    n += c.n_highway * 2 * (f * f + f)
    if config.has_char_projection:
        n += config.projection_input_dim * l.projection_dim + l.projection_dim
    for _ in range(l.n_layers):
        n_in = l.projection_dim
        per_direction = (n_in + l.projection_dim) * 4 * l.dim + 4 * l.dim + l.dim * l.projection_dim
        n += 2 * per_direction
    return n


def _validate(config: ElmoConfig) -> None:
    c, l = config.char_cnn, config.lstm
    if c.activation not in ACTIVATIONS:
        raise ConfigError(f"char_cnn.activation {c.activation!r} is not supported; use one of {ACTIVATIONS}")
    if c.max_characters_per_token < 3:  # a word's begin and end chars plus at least one
        raise ConfigError(f"char_cnn.max_characters_per_token must be >= 3, got {c.max_characters_per_token}")
    if not c.filters:
        raise ConfigError("char_cnn.filters is empty; give at least one [width, count] pair")
    for w, n in c.filters:
        if w < 1 or n < 1:
            raise ConfigError(f"char_cnn.filters entry [{w}, {n}]: width and count must be >= 1")
        if w > c.max_characters_per_token:
            raise ConfigError(
                f"char_cnn.filters width {w} exceeds max_characters_per_token {c.max_characters_per_token}"
            )
    positive = {
        "char_cnn.embedding_dim": c.embedding_dim,
        "lstm.dim": l.dim,
        "lstm.projection_dim": l.projection_dim,
        "lstm.n_layers": l.n_layers,
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"{name} must be positive, got {value}")
    if c.n_highway < 0:
        raise ConfigError(f"char_cnn.n_highway must be >= 0, got {c.n_highway}")
    if config.vocab is not None:
        _validate_vocab(config.vocab, c)
    elif c.n_characters not in (chars.N_RAW_CHARS, chars.N_CHARS):
        raise ConfigError(f"char_cnn.n_characters must be 261 or 262, got {c.n_characters}")
    for name, clip in (("cell_clip", l.cell_clip), ("proj_clip", l.proj_clip)):
        if clip is not None and not clip > 0:
            raise ConfigError(f"lstm.{name} must be positive or absent, got {clip}")


def _validate_vocab(v: VocabConfig, c: CharCNNConfig) -> None:
    if v.n_chars < 1 or c.n_characters != v.n_chars + 1:
        raise ConfigError(
            f"vocab.n_chars is {v.n_chars}: it must be positive and char_cnn.n_characters "
            f"({c.n_characters}) one more (the padding row)"
        )
    if len(v.char_ids) != len(CHAR_ROLES) or not all(0 <= i < v.n_chars for i in v.char_ids):
        raise ConfigError(
            f"vocab.char_ids {v.char_ids} must give {', '.join(CHAR_ROLES)} as ids below n_chars={v.n_chars}"
        )
    if v.word_dim < 0:
        raise ConfigError(f"vocab.word_dim must be >= 0, got {v.word_dim}")
    if v.word_dim and (
        v.n_words < 1 or len(v.word_ids) != len(WORD_ROLES) or not all(0 <= i < v.n_words for i in v.word_ids)
    ):
        raise ConfigError(
            f"vocab.word_ids {v.word_ids} must give {', '.join(WORD_ROLES)} as ids below n_words={v.n_words}"
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: float) -> float | int:
    return int(v) if float(v).is_integer() else float(v)


def _section(d: dict, key: str, source: str, prefix: str = "") -> dict:
    if key not in d:
        raise ConfigError(f"{source}: missing section {prefix}{key!r}")
    if not isinstance(d[key], dict):
        raise ConfigError(f"{source}: {prefix}{key} must be an object, got {type(d[key]).__name__}")
    return d[key]


_MISSING = object()


def _filter_pairs(filters: Any, where: str) -> tuple[tuple[int, int], ...]:
    """``filters`` as ``((width, count), ...)``; a ConfigError naming ``where`` otherwise."""
    if not isinstance(filters, (list, tuple)):
        raise ConfigError(f"{where} must be a list of [width, count] integer pairs, got {filters!r}")
    for f in filters:
        if not (isinstance(f, (list, tuple)) and len(f) == 2 and all(_is_int(v) for v in f)):
            raise ConfigError(f"{where} must be a list of [width, count] integer pairs, found {f!r}")
    return tuple((int(w), int(n)) for w, n in filters)


def _field(d: dict, key: str, typ: type, source: str, prefix: str, default: Any = _MISSING) -> Any:
    if key not in d:
        if default is not _MISSING:
            return default
        raise ConfigError(f"{source}: missing field {prefix}{key}")
    v = d[key]
    ok = _is_int(v) if typ is int else isinstance(v, typ)
    if not ok:
        raise ConfigError(f"{source}: field {prefix}{key} must be {typ.__name__}, got {type(v).__name__} ({v!r})")
    return v


def _optional_number(d: dict, key: str, source: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{source}: field lstm.{key} must be a number, got {v!r}")
    return float(v)


PRESETS: dict[str, ElmoConfig] = {
    "original": ElmoConfig(CharCNNConfig(n_highway=2), LSTMConfig(dim=4096, projection_dim=512)),
    "medium": ElmoConfig(CharCNNConfig(n_highway=1), LSTMConfig(dim=2048, projection_dim=256)),
    "small": ElmoConfig(CharCNNConfig(n_highway=1), LSTMConfig(dim=1024, projection_dim=128)),
    # For tests and the embedded corpus: seconds to compile and run on a CPU.
    "tiny": ElmoConfig(
        CharCNNConfig(
            embedding_dim=8,
            filters=((1, 16), (2, 16), (3, 32), (4, 64)),
            n_highway=1,
            max_characters_per_token=50,
        ),
        LSTMConfig(dim=128, projection_dim=32, n_layers=2),
    ),
}
