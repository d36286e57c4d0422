"""Continued pretraining: a new run that starts from existing weights (``init_from``).

``--config.init_from=SPEC`` names where the weights come from:

* a folder with ``options.json`` and a weight file: what ``elmo-jax export`` writes (also
  ``vocab.txt`` + ``softmax.hdf5``), or a released model's folder (``*options*.json`` +
  ``*weights*.hdf5``, no softmax);
* another run's workdir (``config.json`` + ``checkpoints/``): its latest checkpoint, with its
  softmax and ``vocab.txt``;
* anything else: a released model's name or a URL, resolved to a folder by
  :func:`elmo_jax.resolve.resolve_model` (downloaded once into the cache).

What the new run takes from there:

* the architecture: the model's ``options.json``.  The run records it as ``model_overrides``
  on the config's ``model`` preset (so ``config.json`` describes the run on its own, and
  ``export``/``eval`` read it as usual); overrides the user gave must agree with it, or the
  run is refused with the differences;
* every biLM weight (char CNN, highway, projection, LSTMs), as stored;
* the softmax row by row: the new vocabulary is built from the new data as usual, and each
  of its tokens that the model's ``vocab.txt`` holds gets that token's row (``w`` and ``b``,
  bit for bit); the other rows are those a fresh run with the same seed would have;
* nothing else: the optimizer state and the step count start fresh.

A restart of such a run (the same command) reads its own latest checkpoint, never
``init_from``: the architecture is then taken from the run's ``config.json``, so a restart
needs neither the network nor the source folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import h5py
import jax
import numpy as np

from elmo_jax.config import CharCNNConfig, ElmoConfig, LSTMConfig
from elmo_jax.data.vocab import Vocabulary
from elmo_jax.resolve import resolve_model
from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.workdir import TrainingError
from elmo_jax.formats.hdf5 import check_finite_weights

SOFTMAX_FILE = "softmax.hdf5"  # what elmo-jax export writes beside the model (train.export)
VOCAB_FILE = "vocab.txt"


@dataclasses.dataclass
class Pretrained:
    """Weights read from an ``init_from`` source.

    ``softmax``: ``{"w": [V0, P], "b": [V0]}`` with row ``i`` for ``tokens[i]``, or None
    when the source has no softmax (released models); ``note`` says why in that case.
    """

    source: str
    config: ElmoConfig
    bilm: dict
    softmax: dict | None
    tokens: list[str] | None
    note: str = ""


def architecture_fields(config: ElmoConfig) -> dict[str, Any]:
    """Every ``ElmoConfig.replace`` field of ``config`` with its value."""
    return {
        **{f.name: getattr(config.char_cnn, f.name) for f in dataclasses.fields(CharCNNConfig)},
        **{f.name: getattr(config.lstm, f.name) for f in dataclasses.fields(LSTMConfig)},
    }


# n_characters 261 and 262 describe the same model (config.py); it is never a difference.
_SAME_MODEL_FIELDS = {"n_characters"}


def adopt_architecture(cfg: TrainConfig, architecture: ElmoConfig, source: str) -> TrainConfig:
    """``cfg`` with ``model_overrides`` that turn its ``model`` preset into ``architecture``.

    Overrides the config already gives must say what ``architecture`` says; otherwise a
    :class:`TrainingError` lists each difference.
    """
    preset = ElmoConfig.preset(cfg.model)
    wanted = architecture_fields(architecture)
    differences = []
    for key, value in sorted(cfg.model_overrides.items()):
        if key in _SAME_MODEL_FIELDS:
            continue
        mine = architecture_fields(preset.replace(**{key: value}))[key]
        if mine != wanted[key]:
            differences.append(
                f"model_overrides.{key}: the config has {_show(mine)}, the model has {_show(wanted[key])}"
            )
    if differences:
        raise TrainingError(
            f"the config contradicts the architecture of init_from {source}:\n  "
            + "\n  ".join(differences)
            + "\nthe architecture comes from the model's options.json: drop these model_overrides "
            "(or start from scratch without init_from to train another architecture)"
        )
    base = architecture_fields(preset)
    overrides = {k: _plain(v) for k, v in wanted.items() if k not in _SAME_MODEL_FIELDS and base[k] != v}
    return cfg.replace(model_overrides=overrides)


def start_config(
    cfg: TrainConfig, workdir: str, resuming: bool, *, progress: bool = True, log: Callable[[str], None] = print
) -> tuple[TrainConfig, Pretrained | None]:
    """The config of an ``init_from`` run and, for a new run, the weights to start from.

    A new run reads ``cfg.init_from``; a resumed one (``resuming``: the workdir has a
    checkpoint) reads only its own ``config.json`` (the architecture it recorded) and
    returns no weights: the checkpoint holds them.
    """
    if cfg.init_from is None:
        return cfg, None
    if resuming:
        return adopt_architecture(cfg, _recorded_architecture(workdir), f"(as recorded in {workdir})"), None
    pretrained = load_pretrained(cfg.init_from, progress=progress)
    log(f"init_from {cfg.init_from}: the architecture and weights of {pretrained.source}")
    return adopt_architecture(cfg, pretrained.config, pretrained.source), pretrained


def _recorded_architecture(workdir: str) -> ElmoConfig:
    config_path = os.path.join(workdir, "config.json")
    options_path = os.path.join(workdir, "options.json")
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            return TrainConfig(**json.load(f)).elmo_config()
    if os.path.exists(options_path):
        return ElmoConfig.from_json_file(options_path)
    raise TrainingError(
        f"{workdir} has a checkpoint but neither config.json nor options.json: the run's "
        f"architecture is unknown; restore them or start a new --workdir"
    )


def load_pretrained(spec: str, *, progress: bool = True) -> Pretrained:
    """The weights ``spec`` names (see the module docstring)."""
    folder = resolve_folder(spec, progress=progress)
    if os.path.exists(os.path.join(folder, "config.json")) and os.path.isdir(os.path.join(folder, "checkpoints")):
        return _from_workdir(folder)
    return _from_model_folder(folder)


def resolve_folder(spec: str, *, progress: bool = True) -> str:
    """A local folder for ``spec``: the folder itself, or the hub's copy of a name / URL."""
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        return os.path.abspath(path)
    if os.path.exists(path):
        raise TrainingError(
            f"init_from {spec!r} is a file; give the model's folder (options.json and the "
            f"weight file), a run's workdir, a released model's name or a URL"
        )
    if "://" not in spec and (os.sep in spec or spec.startswith((".", "~"))):
        raise TrainingError(f"init_from folder {spec!r} not found")
    return os.path.abspath(os.fspath(resolve_model(spec, progress=progress)))


def _from_workdir(folder: str) -> Pretrained:
    from elmo_jax.train.checkpoints import CheckpointError
    from elmo_jax.formats.training_run import load_checkpoint_params

    try:
        loaded = load_checkpoint_params(folder)
    except CheckpointError as e:
        raise TrainingError(f"init_from {folder} is a training workdir without a usable checkpoint: {e}") from None
    params = jax.tree.map(np.asarray, loaded.params)
    return Pretrained(
        f"{folder} (checkpoint {loaded.step})",
        loaded.model_config,
        params["bilm"],
        params["softmax"],
        loaded.vocab.tokens,
    )


def _from_model_folder(folder: str) -> Pretrained:
    from elmo_jax.embedding.embedder import Elmo

    elmo = Elmo.load(folder)
    if elmo.config.vocab is not None:
        raise TrainingError(
            f"init_from {folder}: an ELMoForManyLangs model reads its tokens as char.dic / word.dic ids and "
            f"has a word table, while pretraining here feeds UTF-8 byte ids to a char-CNN-only model, so its "
            f"weights cannot continue training here; use it with Elmo.embed, ElmoLayer or elmo_jax.finetune, "
            f"or pretrain a model of your own (train.py) on your corpus"
        )
    bilm = jax.tree.map(lambda x: np.asarray(x, np.float32), elmo.params)
    softmax_path, vocab_path = os.path.join(folder, SOFTMAX_FILE), os.path.join(folder, VOCAB_FILE)
    if not os.path.exists(softmax_path):
        return Pretrained(
            folder, elmo.config, bilm, None, None, note=f"{folder} has no {SOFTMAX_FILE} (released models ship none)"
        )
    if not os.path.exists(vocab_path):
        raise TrainingError(
            f"{folder} has {SOFTMAX_FILE} but no {VOCAB_FILE}: which row is which token is "
            f"unknown; put the export's {VOCAB_FILE} beside it, or remove {SOFTMAX_FILE} "
            f"to start the softmax fresh"
        )
    tokens = Vocabulary.load(vocab_path).tokens
    try:
        with h5py.File(softmax_path, "r") as f:
            softmax = {
                "w": np.asarray(f["softmax/W"][...], np.float32),
                "b": np.asarray(f["softmax/b"][...], np.float32),
            }
    except (OSError, KeyError) as e:
        raise TrainingError(
            f"{softmax_path} is not a softmax written by elmo-jax export ({e}); remove it to start the softmax fresh"
        ) from None
    check_finite_weights({f"softmax/{k}": v for k, v in softmax.items()}, softmax_path)
    want_w, want_b = (len(tokens), elmo.config.projection_dim), (len(tokens),)
    if softmax["w"].shape != want_w or softmax["b"].shape != want_b:
        raise TrainingError(
            f"{softmax_path} holds softmax/W {softmax['w'].shape} and softmax/b "
            f"{softmax['b'].shape}; {VOCAB_FILE} ({len(tokens)} tokens) and options.json "
            f"(projection_dim {elmo.config.projection_dim}) say {want_w} and {want_b}"
        )
    return Pretrained(folder, elmo.config, bilm, softmax, tokens)


def carry_softmax(fresh: dict, vocab: Vocabulary, pretrained: Pretrained) -> tuple[dict, int]:
    """The softmax ``{"w": [V, P], "b": [V]}`` of the new vocabulary: the rows of the tokens
    ``pretrained`` has, copied; ``fresh``'s rows for the others.  Returns it and the number
    of rows carried over."""
    w = np.array(fresh["w"], np.float32)
    b = np.array(fresh["b"], np.float32)
    if pretrained.softmax is None:
        return {"w": w, "b": b}, 0
    assert pretrained.tokens is not None  # a softmax is read with its tokens (one per row)
    source_row = {token: i for i, token in enumerate(pretrained.tokens)}
    pairs = [(i, source_row[t]) for i, t in enumerate(vocab.tokens) if t in source_row]
    if pairs:
        new_rows, old_rows = (np.asarray(x) for x in zip(*pairs))
        w[new_rows] = pretrained.softmax["w"][old_rows]
        b[new_rows] = pretrained.softmax["b"][old_rows]
    return {"w": w, "b": b}, len(pairs)


def initial_train_state(
    fresh: dict, pretrained: Pretrained, vocab: Vocabulary, optimizer, log: Callable[[str], None] = print
) -> dict:
    """The train state a new ``init_from`` run starts with: the pretrained biLM, the carried
    softmax (:func:`carry_softmax`), a fresh optimizer state and step 0.  ``fresh``: the
    state a fresh run would start with (gives the fresh softmax rows and the layout)."""
    softmax, carried = carry_softmax(fresh["params"]["softmax"], vocab, pretrained)
    params = {"bilm": pretrained.bilm, "softmax": softmax}
    expected = jax.tree.map(lambda x: (np.shape(x), np.dtype(x.dtype)), fresh["params"])
    got = jax.tree.map(lambda x: (np.shape(x), np.dtype(x.dtype)), params)
    # jaxlib's PyTreeDef has no usable type for mypy (it compares with != at run time)
    other_structure = jax.tree.structure(expected) != jax.tree.structure(got)  # type: ignore[operator]
    if other_structure or jax.tree.leaves(expected) != jax.tree.leaves(got):
        raise TrainingError(
            f"the weights of {pretrained.source} do not have the layout of their own "
            f"options.json; is the weight file the one these options describe?"
        )
    why = f" ({pretrained.note})" if pretrained.note else ""
    log(
        f"init_from: biLM weights from {pretrained.source}; softmax rows carried over: {carried} of "
        f"{len(vocab)}{why}, the others fresh; optimizer state fresh"
    )
    return {"params": params, "opt_state": optimizer.init(params), "step": np.asarray(fresh["step"])}


def _plain(value: Any) -> Any:
    """A config value as JSON writes it back (tuples as lists)."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _show(value: Any) -> str:
    return repr(_plain(value))
