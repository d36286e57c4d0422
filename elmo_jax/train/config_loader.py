"""Training configs as Python files, with ``--config.KEY=VALUE`` command-line overrides.

(Over 500 lines: a third is :class:`TrainConfig`'s fields, each with its documentation.)

A config file (``configs/tiny.py`` and friends) defines ``get_config()`` returning a
:class:`TrainConfig` (or a dict of its fields)::

    from elmo_jax.train.config_loader import TrainConfig

    def get_config():
        return TrainConfig(model="small", data="lm1b", batch_size_per_device=128)

On the command line::

    elmo-jax train --config configs/small.py --config.learning_rate=0.1 \\
        --config.model_overrides.dim 512 --config.max_steps=none

Values are converted by the field's declared type (``int``, ``float``, ``bool`` as
true/false/1/0/yes/no, ``str``, ``none``/``null`` for optional fields, dicts by dotted keys or
a Python literal); ``model_overrides.KEY`` values by the type of the ``ElmoConfig`` field.
Everything here is plain Python (no jax import).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import math
import importlib.util
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, Sequence

from elmo_jax.config import COMPUTE_DTYPES, PRESETS, CharCNNConfig, ConfigError, ElmoConfig, LSTMConfig

__all__ = [
    "COMPUTE_DTYPES",
    "ConfigError",
    "DEFAULT_CONFIG",
    "PARALLEL_MODES",
    "TrainConfig",
    "apply_overrides",
    "load_config",
    "parse_config_args",
    "resolve_config_path",
]

OPTIMIZERS = ("adagrad", "adam")
PARALLEL_MODES = ("pmap", "mesh")
SOFTMAX_UPDATES = ("dense", "sparse")
DEFAULT_CONFIG = "configs/tiny.py"


# A worker is a process: more than this is a typo, not a host (configs/original.py uses 4).
MAX_DATA_WORKERS = 256


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a pretraining run needs besides the machine.

    Model
      model: preset name of the architecture (``tiny``, ``small``, ``medium``, ``original``).
      model_overrides: ``ElmoConfig.replace`` arguments applied to the preset, e.g.
        ``{"dim": 64, "n_layers": 1}``.
      init_from: start a new run from existing weights (continued pretraining): a released
        model's name or URL, a model folder (``elmo-jax export``'s, or a released one), or
        another run's workdir (None: from scratch).  The architecture is then the model's
        (recorded as ``model_overrides``); see :mod:`elmo_jax.train.init_from`.
    Data
      data: corpus source spec; ``"synthetic"`` is the corpus embedded in the package, ``"lm1b"``
        the 1B Word Benchmark (interpreted by the data module).
      data_dir: where prepared data lives (None: ``WORKDIR/tfds`` for text this package
        prepares, TFDS's own folder (``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``) for
        ``lm1b``).
      heldout: held-out evaluation source (None: ``lm1b``'s test split for ``lm1b``, held-out
        shard 0 for ``lm1b-extracted:ROOT``, the corpus's own for ``synthetic``, none for
        local text).
      vocab_size: keep the most frequent ``vocab_size`` tokens as softmax targets (None: all).
      vocab_min_count: drop tokens seen fewer times than this from the vocabulary.
      corpus_size: number of training sentences of the synthetic corpus (None: its default).
    Batches
      batch_size: GLOBAL number of rows (streams) per step, split over all devices.
      batch_size_per_device: when set, overrides ``batch_size``: the global batch is this times
        the number of devices (the original recipe: 128 per GPU); see :meth:`global_batch_size`.
      unroll_steps: tokens per row per step (truncated-BPTT window).
      data_workers: processes that read and encode training sentences while the step runs
        (a background thread assembles the batches); 0 builds each batch in the training
        thread.  Any value gives the same batches, and a run may resume with another value.
        The same number of processes counts the vocabulary and prepares local text.
    Objective and optimiser
      num_negatives: sampled-softmax negatives per step; the full softmax is used when the
        vocabulary is not larger than this.
      optimizer: ``"adagrad"`` (the original recipe) or ``"adam"``.
      learning_rate: the optimizer's learning rate.
      initial_accumulator: Adagrad's initial accumulator value (unused by Adam).
      clip_norm: global-norm gradient clipping threshold (after averaging over devices).
      dropout: dropout rate on LSTM inputs and the top LSTM output.
    Schedule
      epochs: passes over the training corpus.
      max_steps: stop after this many steps even if epochs remain (None: no limit).
      seed: seed of parameter init, dropout, sampling and data shuffling.
      compute_dtype: ``"float32"`` or ``"bfloat16"`` activations (params stay float32).
      remat_steps: 0 keeps every LSTM step's activations for the backward pass; ``k > 0``
        keeps one state per ``k`` steps and recomputes the rest (``jax.checkpoint``), for long
        ``unroll_steps`` on a small accelerator; same results, about 1/3 more LSTM compute.
      checkpoint_every: steps between checkpoints.
      keep_checkpoints: how many recent checkpoints to keep.
      eval_every: steps between held-out evaluations (0: only at the end).
      eval_max_batches: stop each held-out evaluation after this many batches of 32 x
        ``unroll_steps`` positions (None: the whole held-out set), always the same first
        ones; for a large held-out set such as ``lm1b``'s test split (about 8M tokens).
      log_every: steps between log lines.
      parallel: ``"pmap"`` or ``"mesh"`` (``jit`` over a device mesh) data parallelism.
      softmax_update: ``"dense"`` updates every row of the softmax each step; ``"sparse"``
        (sampled softmax with Adagrad only) computes the gradient and the Adagrad update on
        the rows the step touches (negatives and targets), the same numbers up to the order
        of float sums and far less memory traffic for a large vocabulary.  With the full
        softmax (a vocabulary not larger than ``num_negatives``) the update is dense.
    """

    model: str = "tiny"
    model_overrides: dict = dataclasses.field(default_factory=dict)
    init_from: str | None = None
    data: str = "synthetic"
    data_dir: str | None = None
    heldout: str | None = None
    vocab_size: int | None = None
    vocab_min_count: int = 1
    corpus_size: int | None = None
    batch_size: int = 16
    batch_size_per_device: int | None = None
    unroll_steps: int = 20
    data_workers: int = 0
    num_negatives: int = 8192
    optimizer: str = "adagrad"
    learning_rate: float = 0.2
    initial_accumulator: float = 1.0
    clip_norm: float = 10.0
    dropout: float = 0.1
    epochs: int = 10
    max_steps: int | None = None
    seed: int = 0
    compute_dtype: str = "float32"
    remat_steps: int = 0
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    eval_every: int = 0
    eval_max_batches: int | None = None
    log_every: int = 50
    parallel: str = "pmap"
    softmax_update: str = "dense"

    def __post_init__(self):
        # Own a copy, so the (mutable) dict can't be changed behind a frozen config.
        object.__setattr__(self, "model_overrides", dict(self.model_overrides or {}))
        _validate(self)

    def __hash__(self):  # dict field: hash by its items
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return hash(tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v for v in values))

    # -- derived -----------------------------------------------------------------------------
    def elmo_config(self) -> ElmoConfig:
        """The architecture: the ``model`` preset with ``model_overrides`` applied."""
        return ElmoConfig.preset(self.model).replace(**self.model_overrides)

    def global_batch_size(self, device_count: int) -> int:
        """Rows per step over all ``device_count`` devices (must divide evenly)."""
        if device_count < 1:
            raise ConfigError(f"device_count must be positive, got {device_count}")
        if self.batch_size_per_device is not None:
            return self.batch_size_per_device * device_count
        if self.batch_size % device_count:
            raise ConfigError(
                f"batch_size {self.batch_size} is not divisible by the {device_count} devices; "
                f"use a multiple of {device_count} or set batch_size_per_device"
            )
        return self.batch_size

    def replace(self, **changes: Any) -> "TrainConfig":
        unknown = set(changes) - set(field_names())
        if unknown:
            raise ConfigError(_unknown_message(sorted(unknown)[0]))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain, JSON-serialisable dict of the fields."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def _plain(v):
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


# -- validation --------------------------------------------------------------------------------


def _validate(cfg: TrainConfig) -> None:
    hints = _train_hints()
    for f in dataclasses.fields(cfg):
        _check_type(f.name, getattr(cfg, f.name), hints[f.name])

    if cfg.model not in PRESETS:
        raise ConfigError(f"model {cfg.model!r} is not a preset; choose one of {', '.join(sorted(PRESETS))}")
    model_hints = _model_hints()
    for key, value in cfg.model_overrides.items():  # a dict from a config file or a literal
        if key in model_hints:
            _check_type(f"model_overrides.{key}", _lists_as_tuples(value), model_hints[key])
    try:
        cfg.elmo_config()
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"model_overrides {cfg.model_overrides!r}: {e}") from None
    if cfg.compute_dtype not in COMPUTE_DTYPES:
        raise ConfigError(
            f"compute_dtype {cfg.compute_dtype!r} is not supported; use one of {', '.join(COMPUTE_DTYPES)}"
        )
    if cfg.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer {cfg.optimizer!r} is not supported; use one of {', '.join(OPTIMIZERS)}")
    if cfg.parallel not in PARALLEL_MODES:
        raise ConfigError(f"parallel {cfg.parallel!r} is not supported; use one of {', '.join(PARALLEL_MODES)}")
    if cfg.softmax_update not in SOFTMAX_UPDATES:
        raise ConfigError(
            f"softmax_update {cfg.softmax_update!r} is not supported; use one of {', '.join(SOFTMAX_UPDATES)}"
        )
    if cfg.softmax_update == "sparse" and cfg.optimizer != "adagrad":
        raise ConfigError(
            f"softmax_update 'sparse' needs optimizer 'adagrad' (with {cfg.optimizer!r} the rows a step "
            f"does not touch still move); set softmax_update='dense'"
        )
    if not cfg.data:
        raise ConfigError("data must name a corpus source, e.g. 'synthetic' or 'lm1b'")
    if cfg.init_from is not None and not cfg.init_from:
        raise ConfigError("init_from is empty: give a model name, URL or folder, or none to train from scratch")
    for name in ("data", "heldout", "init_from"):
        value = getattr(cfg, name)
        if value is not None and value != value.strip():
            raise ConfigError(f"{name} {value!r} has surrounding spaces; write {value.strip()!r}")

    at_least = {
        "batch_size": (cfg.batch_size, 1),
        "unroll_steps": (cfg.unroll_steps, 1),
        "data_workers": (cfg.data_workers, 0),
        "num_negatives": (cfg.num_negatives, 1),
        "vocab_min_count": (cfg.vocab_min_count, 1),
        "epochs": (cfg.epochs, 1),
        "checkpoint_every": (cfg.checkpoint_every, 1),
        "keep_checkpoints": (cfg.keep_checkpoints, 1),
        "log_every": (cfg.log_every, 1),
        "eval_every": (cfg.eval_every, 0),
        "eval_max_batches": (cfg.eval_max_batches, 1),
        "remat_steps": (cfg.remat_steps, 0),
        "seed": (cfg.seed, 0),
        "batch_size_per_device": (cfg.batch_size_per_device, 1),
        "max_steps": (cfg.max_steps, 1),
        "vocab_size": (cfg.vocab_size, 4),  # <S>, </S>, <UNK> and at least one word
        "corpus_size": (cfg.corpus_size, 1),
    }
    if cfg.data_workers is not None and cfg.data_workers > MAX_DATA_WORKERS:
        raise ConfigError(
            f"data_workers {cfg.data_workers} is more than {MAX_DATA_WORKERS}: each is a process; "
            f"use about the number of host cores the step leaves free"
        )
    for name, (value, low) in at_least.items():
        if value is not None and value < low:
            raise ConfigError(f"{name} must be >= {low}, got {value}")
    for name in ("learning_rate", "clip_norm"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    if not math.isfinite(cfg.learning_rate):
        raise ConfigError(f"learning_rate must be finite, got {cfg.learning_rate}")
    if not cfg.initial_accumulator >= 0:
        raise ConfigError(f"initial_accumulator must be >= 0, got {cfg.initial_accumulator}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {cfg.dropout}")


def _lists_as_tuples(value: Any) -> Any:
    return tuple(_lists_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _check_type(name: str, value: Any, tp: Any) -> None:
    if not _isinstance(value, tp):
        raise ConfigError(f"{name} must be {_type_name(tp)}, got {type(value).__name__} ({value!r})")


def _isinstance(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_isinstance(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # ints are fine where floats are expected
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, tp)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    return getattr(origin or tp, "__name__", str(tp))


@functools.cache
def _hints(cls: type) -> dict:
    """The resolved field types of a config dataclass (fixed per class, so computed once)."""
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def _train_hints() -> dict:
    return _hints(TrainConfig)


def _model_hints() -> dict:
    return {**_hints(CharCNNConfig), **_hints(LSTMConfig)}


# -- loading -----------------------------------------------------------------------------------


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]  # elmo_jax/train/config_loader.py


def resolve_config_path(path: str | os.PathLike) -> Path:
    """Find a config file: as given (relative to the current directory), then relative to the
    repository root, then in its ``configs/`` folder; a bare preset name ``small`` means
    ``configs/small.py``."""
    p = Path(path)
    candidates = [p]
    root = _repo_root()
    if not p.is_absolute():
        candidates += [root / p]
        if p.parts[0] != "configs":  # configs/x.py is not looked for in configs/configs/
            candidates += [root / "configs" / p]
        if p.suffix != ".py":
            candidates += [root / "configs" / (p.name + ".py")]
    for c in candidates:
        if c.is_file():
            return c
    if p.is_dir():
        raise ConfigError(f"config {os.fspath(path)!r} is a folder; give a config file such as configs/small.py")
    tried = ", ".join(str(c) for c in dict.fromkeys(candidates))
    shipped = sorted(f.stem for f in (root / "configs").glob("*.py"))
    hint = did_you_mean(
        p.name.removesuffix(".py"), shipped, spell=lambda name: f"configs/{name}.py ({name!r})", cutoff=0.5
    )  # few, short names: 'tyni' is 0.5 from 'tiny'
    raise ConfigError(f"config file {os.fspath(path)!r} not found{hint} (looked at: {tried})")


def load_config(path: str | os.PathLike) -> TrainConfig:
    """Import the Python config file at ``path`` and return its ``get_config()``."""
    file = resolve_config_path(path)
    name = f"_elmo_jax_config_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import config file {file} (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ConfigError as e:
        raise ConfigError(f"{file}: {e}") from None
    except SyntaxError as e:  # other errors keep their traceback: it points into the file
        raise ConfigError(f"{file}, line {e.lineno}: syntax error: {e.msg}") from None
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigError(f"config file {file} does not define a get_config() function")
    try:
        cfg = get_config()
    except ConfigError as e:
        raise ConfigError(f"{file}: get_config(): {e}") from None
    if isinstance(cfg, dict):
        unknown = set(cfg) - set(field_names())
        if unknown:
            raise ConfigError(f"{file}: " + _unknown_message(sorted(unknown)[0]))
        try:
            cfg = TrainConfig(**cfg)
        except ConfigError as e:
            raise ConfigError(f"{file}: {e}") from None
    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"{file}: get_config() returned {type(cfg).__name__}; expected a TrainConfig or dict")
    return cfg


# -- overrides ---------------------------------------------------------------------------------


def did_you_mean(word: str, choices: Sequence[str], spell=repr, cutoff: float = 0.6) -> str:
    """``" (did you mean X?)"`` for the choice closest to a mistyped ``word``, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {spell(close[0])}?)" if close else ""


def _unknown_message(key: str) -> str:
    return f"unknown config key {key!r}{did_you_mean(key, field_names())}; valid keys: {', '.join(field_names())}"


def _unknown_model_message(key: str) -> str:
    valid = sorted(_model_hints())
    return f"unknown model_overrides key {key!r}{did_you_mean(key, valid)}; valid: {', '.join(valid)}"


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null"}


def _convert(text: str, tp: Any, key: str) -> Any:
    """Parse the command-line string ``text`` as a value of type ``tp``."""
    s = text.strip()
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and s.lower() in _NONE:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(s, a, key)
            except ConfigError:
                pass
        hint = " (or none)" if type(None) in args else ""
        raise ConfigError(f"{key}: cannot parse {text!r} as {_type_name(tp)}{hint}")
    if tp is bool:
        if s.lower() in _TRUE:
            return True
        if s.lower() in _FALSE:
            return False
        raise ConfigError(f"{key}: expected a boolean (true/false/1/0/yes/no), got {text!r}")
    if tp is int:
        try:
            return int(s)
        except ValueError:
            pass
        try:  # 1e6 and 2.0 are fine if they are whole numbers
            f = float(s)
        except ValueError:
            f = None
        if f is not None and f.is_integer():
            return int(f)
        raise ConfigError(f"{key}: expected an integer, got {text!r}")
    if tp is float:
        try:
            return float(s)
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {text!r}") from None
    if tp is str:
        if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
            return s[1:-1]  # quoted: taken as written, spaces included
        return s
    # containers (dict, tuples of tuples): a Python literal
    try:
        value = ast.literal_eval(s)
    except (ValueError, SyntaxError):
        raise ConfigError(f"{key}: expected a Python literal of type {_type_name(tp)}, got {text!r}") from None
    if origin is tuple and isinstance(value, list):
        value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
    if not isinstance(value, origin or tp):
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} ({text!r})")
    return value


def _split_override(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like KEY=VALUE")
    key, value = item.split("=", 1)
    key = key.strip()
    for prefix in ("--config.", "config."):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    return key, value


def apply_overrides(cfg: TrainConfig, overrides: Sequence[str]) -> TrainConfig:
    """``cfg`` with ``["KEY=VALUE", ...]`` applied in order.

    ``KEY`` is a :class:`TrainConfig` field, or ``model_overrides.FIELD`` for one
    architecture field (typed like ``ElmoConfig``'s; ``none`` removes an override only for
    fields that may be None, e.g. ``cell_clip``).  Unknown keys and unparseable values raise
    :class:`ConfigError` naming the valid keys / the expected type.
    """
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'KEY=VALUE' strings, not one string")
    hints = _train_hints()
    changes: dict[str, Any] = {}
    for item in overrides:
        key, text = _split_override(item)
        head, _, rest = key.partition(".")
        if head not in hints:
            raise ConfigError(_unknown_message(head))
        if rest:
            if head != "model_overrides":
                raise ConfigError(f"{key}: {head} is not a dict; use --config.{head}=VALUE")
            model_hints = _model_hints()
            if "." in rest or rest not in model_hints:
                raise ConfigError(_unknown_model_message(rest))
            mo = dict(changes.get("model_overrides", cfg.model_overrides))
            mo[rest] = _convert(text, model_hints[rest], key)
            changes["model_overrides"] = mo
        else:
            value = _convert(text, hints[head], key)
            if head == "model_overrides":
                value = dict(value or {})
                unknown = set(value) - set(_model_hints())
                if unknown:
                    raise ConfigError(_unknown_model_message(sorted(unknown)[0]))
            changes[head] = value
    if not changes:
        return cfg
    return dataclasses.replace(cfg, **changes)


def parse_config_args(argv: Sequence[str]) -> tuple[TrainConfig, list[str]]:
    """Take ``--config PATH`` and ``--config.KEY=VALUE`` / ``--config.KEY VALUE`` out of argv.

    Returns the loaded config with the overrides applied (in command-line order) and the
    remaining arguments, in order.  Without ``--config`` the default ``configs/tiny.py`` is
    used.  A ``--`` ends option parsing: everything after it is returned untouched.
    """
    argv = list(argv)
    path: str | None = None
    overrides: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError("--config expects a path to a config file")
                value, i = argv[i + 1], i + 2
            else:
                value, i = arg.split("=", 1)[1], i + 1
            if path is not None:
                raise ConfigError(f"--config given twice ({path!r} and {value!r})")
            path = value
            continue
        if arg.startswith("--config."):
            key = arg[len("--config.") :]
            if "=" in key:
                overrides.append(key)
                i += 1
            else:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError(f"{arg} expects a value: {arg}=VALUE or {arg} VALUE")
                overrides.append(f"{key}={argv[i + 1]}")
                i += 2
            continue
        rest.append(arg)
        i += 1
    cfg = load_config(path if path is not None else DEFAULT_CONFIG)
    return apply_overrides(cfg, overrides), rest
