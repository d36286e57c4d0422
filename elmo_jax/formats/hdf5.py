"""The released models' HDF5 weight layout <-> this package's parameter pytree.

Dataset names and shapes (for filter ``i`` of width ``w`` and count ``n``, highway ``k``,
direction ``d`` (0 forward, 1 backward) and LSTM layer ``l``)::

    char_embed                                      [261, D]   (no padding row on disk)
    CNN/W_cnn_{i}  [1, w, D, n]      CNN/b_cnn_{i}  [n]
    CNN_high_{k}/W_carry, W_transform [F, F]   b_carry, b_transform [F]
    CNN_proj/W_proj [F, P]           CNN_proj/b_proj [P]
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0   [I + P, 4H]  rows: input, then h_prev
                                             .../B     [4H]       gates i, j, f, o
                                             .../W_P_0 [H, P]

A vocabulary model (``config.vocab``, :mod:`elmo_jax.formats.manylangs`) has ``char_embed``
``[n_chars, D]``, ``word_embed [n_words, W]`` (no padding rows on disk) and
``CNN_proj/W_proj [W + F, P]`` (word vector rows first), present even where ``W + F == P``
(a byte model has ``CNN_proj`` only where ``F != P``).

The forget-gate bias 1.0 is not stored (it is added at run time), so no conversion is
needed for it; the padding row of the char table is prepended on load and dropped on save.
Loading then saving gives the same datasets bit for bit.

A model folder holds ``options.json`` + ``weights.hdf5``; the released models' folders name
them ``*options*.json`` and ``*weights*.hdf5`` (:func:`model_files` finds either).
"""

from __future__ import annotations

import os
import re

import h5py
import numpy as np

from elmo_jax import chars
from elmo_jax.atomic import atomic_path
from elmo_jax.config import ElmoConfig
from elmo_jax.errors import ElmoError
from elmo_jax.textio import HDF5_SIGNATURE

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"


class WeightFileError(ElmoError, ValueError):
    """A weight file that does not fit the model described by options.json."""


def _lstm_prefix(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def expected_shapes(config: ElmoConfig) -> dict[str, tuple[int, ...]]:
    """Every dataset of the layout with its shape, for ``config``."""
    c, l = config.char_cnn, config.lstm
    f, p, h = c.n_filters, l.projection_dim, l.dim
    n_chars = chars.N_RAW_CHARS if config.vocab is None else config.vocab.n_chars
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (n_chars, c.embedding_dim)}
    if config.word_dim:  # vocabulary models (config.vocab) only
        assert config.vocab is not None  # word_dim is 0 without one
        shapes["word_embed"] = (config.vocab.n_words, config.word_dim)
    for i, (w, n) in enumerate(c.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, w, c.embedding_dim, n)
        shapes[f"CNN/b_cnn_{i}"] = (n,)
    for k in range(c.n_highway):
        for name in ("W_carry", "W_transform"):
            shapes[f"CNN_high_{k}/{name}"] = (f, f)
        for name in ("b_carry", "b_transform"):
            shapes[f"CNN_high_{k}/{name}"] = (f,)
    if config.has_char_projection:
        shapes["CNN_proj/W_proj"] = (config.projection_input_dim, p)
        shapes["CNN_proj/b_proj"] = (p,)
    for d in range(2):
        for layer in range(l.n_layers):
            pre = _lstm_prefix(d, layer)
            shapes[f"{pre}/W_0"] = (p + p, 4 * h)
            shapes[f"{pre}/B"] = (4 * h,)
            shapes[f"{pre}/W_P_0"] = (h, p)
    return shapes


def params_to_datasets(params: dict, config: ElmoConfig) -> dict[str, np.ndarray]:
    """The pytree as named float32 arrays in the HDF5 layout."""
    a = lambda x: np.asarray(x, dtype=np.float32)  # noqa: E731
    out: dict[str, np.ndarray] = {"char_embed": a(params["char_embed"])[1:]}
    if "word_embed" in params:
        out["word_embed"] = a(params["word_embed"])[1:]
    for i, conv in enumerate(params["cnn"]):
        out[f"CNN/W_cnn_{i}"] = a(conv["w"])[None]
        out[f"CNN/b_cnn_{i}"] = a(conv["b"])
    for k, hw in enumerate(params["highway"]):
        out[f"CNN_high_{k}/W_carry"] = a(hw["w_carry"])
        out[f"CNN_high_{k}/W_transform"] = a(hw["w_transform"])
        out[f"CNN_high_{k}/b_carry"] = a(hw["b_carry"])
        out[f"CNN_high_{k}/b_transform"] = a(hw["b_transform"])
    if "proj" in params:
        out["CNN_proj/W_proj"] = a(params["proj"]["w"])
        out["CNN_proj/b_proj"] = a(params["proj"]["b"])
    for layer, lp in enumerate(params["lstm"]):
        for d in range(2):
            pre = _lstm_prefix(d, layer)
            out[f"{pre}/W_0"] = np.concatenate([a(lp["w_x"][d]), a(lp["w_h"][d])], axis=0)
            out[f"{pre}/B"] = a(lp["b"][d])
            out[f"{pre}/W_P_0"] = a(lp["w_p"][d])
    return out


def datasets_to_params(datasets: dict[str, np.ndarray], config: ElmoConfig) -> dict:
    """Named arrays in the HDF5 layout -> the parameter pytree (numpy, float32)."""
    c, l = config.char_cnn, config.lstm
    table = datasets["char_embed"]
    params: dict = {
        "char_embed": np.concatenate([np.zeros((1, table.shape[1]), np.float32), table], axis=0),
        "cnn": [{"w": datasets[f"CNN/W_cnn_{i}"][0], "b": datasets[f"CNN/b_cnn_{i}"]} for i in range(len(c.filters))],
        "highway": [
            {
                "w_carry": datasets[f"CNN_high_{k}/W_carry"],
                "b_carry": datasets[f"CNN_high_{k}/b_carry"],
                "w_transform": datasets[f"CNN_high_{k}/W_transform"],
                "b_transform": datasets[f"CNN_high_{k}/b_transform"],
            }
            for k in range(c.n_highway)
        ],
    }
    if config.word_dim:
        words = datasets["word_embed"]
        params["word_embed"] = np.concatenate([np.zeros((1, words.shape[1]), np.float32), words], axis=0)
    if config.has_char_projection:
        params["proj"] = {"w": datasets["CNN_proj/W_proj"], "b": datasets["CNN_proj/b_proj"]}
    n_in = l.projection_dim
    lstm = []
    for layer in range(l.n_layers):
        w0 = [datasets[f"{_lstm_prefix(d, layer)}/W_0"] for d in range(2)]
        lstm.append(
            {
                "w_x": np.stack([w[:n_in] for w in w0]),
                "w_h": np.stack([w[n_in:] for w in w0]),
                "b": np.stack([datasets[f"{_lstm_prefix(d, layer)}/B"] for d in range(2)]),
                "w_p": np.stack([datasets[f"{_lstm_prefix(d, layer)}/W_P_0"] for d in range(2)]),
            }
        )
    params["lstm"] = lstm
    return params


def hdf5_damage(path: str, error: OSError) -> str | None:
    """Why h5py could not open ``path`` (the ``error`` it raised), if the file is an HDF5 file
    that is empty, cut short or damaged: the end of a sentence starting with ``is``
    ("is truncated: ...").  ``None`` when the file is not HDF5 at all (another kind of
    file, e.g. two arguments given the wrong way round)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(len(HDF5_SIGNATURE))
    except OSError:
        return None
    if size == 0:
        return "is empty (0 bytes): an interrupted copy or write?"
    if not HDF5_SIGNATURE.startswith(head):
        return None
    m = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", str(error))
    if m:
        return (
            f"is truncated: it holds {int(m[1]):,} of the {int(m[2]):,} bytes its HDF5 header declares "
            f"(an interrupted copy or download?)"
        )
    if len(head) < len(HDF5_SIGNATURE):
        return f"is truncated: {size} bytes, shorter than an HDF5 header"
    return f"is a damaged HDF5 file ({error})"


def load_weights(path: str | os.PathLike, config: ElmoConfig) -> dict:
    """Read an HDF5 weight file into the parameter pytree, checking every name and shape."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"weight file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        damage = hdf5_damage(path, e)
        if damage:
            raise WeightFileError(f"{path} {damage}; copy or download the weight file again") from None
        raise WeightFileError(
            f"{path} is not a readable HDF5 file ({e}); the weight file is the .hdf5 one, options.json the JSON one"
        ) from None
    datasets = {}
    with f:
        try:
            _refuse_undescribed(f, path, expected_shapes(config))
            for name, shape in expected_shapes(config).items():
                if name not in f or not isinstance(f[name], h5py.Dataset):
                    raise WeightFileError(
                        f"{path}: dataset {name!r} is missing (expected shape {shape}); "
                        f"does options.json describe this weight file?"
                    )
                found = f[name].shape
                if name == "char_embed" and config.vocab is None and found == (chars.N_CHARS, shape[1]):
                    # A table saved with its padding row: drop it, it is re-added below.
                    datasets[name] = np.asarray(f[name][1:], dtype=np.float32)
                    continue
                if found != shape:
                    raise WeightFileError(
                        f"{path}: dataset {name!r} has shape {found}, expected {shape} from "
                        f"options.json; the options do not fit these weights"
                    )
                datasets[name] = np.asarray(f[name][...], dtype=np.float32)
        except OSError as e:  # the header opened, a dataset did not read: the file is damaged
            raise WeightFileError(
                f"{path} is a damaged HDF5 file ({e}); copy or download the weight file again"
            ) from None
    check_finite_weights(datasets, path)
    return datasets_to_params(datasets, config)


def check_finite_weights(datasets: dict[str, np.ndarray], source: str) -> None:
    """Refuse weights holding NaN or infinity (a diverged run's, or a damaged copy): they
    embed every sentence to NaN.  ``datasets``: name -> array; ``source`` names where they
    were read."""
    for name, array in datasets.items():
        bad = array.size - int(np.count_nonzero(np.isfinite(array)))
        if bad:
            raise WeightFileError(
                f"{source}: weight {name!r} holds {bad} NaN or infinite value(s) of {array.size}; every "
                f"vector it gives would be NaN. Use weights from before the damage (an earlier checkpoint "
                f"exported with `elmo-jax export --step`, or a fresh copy of the file)"
            )


_LAYOUT_PREFIXES = ("char_embed", "word_embed", "CNN/", "CNN_high_", "CNN_proj/", "RNN_")


def _refuse_undescribed(f: h5py.File, path: str, expected: dict) -> None:
    """Refuse a file holding layout datasets the options do not describe (a highway or LSTM
    layer, a filter, a projection): loading would silently drop them and give wrong vectors.
    Datasets outside the layout (anything not named like it) are left alone."""
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    extra = sorted(n for n in names if n.startswith(_LAYOUT_PREFIXES) and n not in expected)
    if extra:
        shown = ", ".join(extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
        if all(n.startswith("CNN_proj/") for n in extra):
            why = (
                "the options give the filters' sum the width of lstm.projection_dim, and such byte-model "
                "options have no projection (check filters and lstm.projection_dim)"
            )
        else:
            why = (
                "the options say fewer layers or filters than the weights have (check n_highway, "
                "lstm.n_layers, filters)"
            )
        raise WeightFileError(f"{path} holds {shown}, which options.json does not describe; {why}")


def save_weights(params: dict, config: ElmoConfig, path: str | os.PathLike) -> None:
    """Write the parameter pytree in the released HDF5 layout, atomically."""
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for name, array in params_to_datasets(params, config).items():
            f.create_dataset(name, data=array)


def model_files(model_dir: str | os.PathLike) -> tuple[str, str]:
    """The options and weight files of the model folder ``model_dir``: ``options.json`` and
    ``weights.hdf5``, else its one ``*options*.json`` and one ``*weights*.hdf5``."""
    model_dir = os.fspath(model_dir)
    return (
        _find_file(model_dir, OPTIONS_FILE, "options", ".json"),
        _find_file(model_dir, WEIGHTS_FILE, "weights", ".hdf5"),
    )


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
            f"a model folder holds {OPTIONS_FILE} and {WEIGHTS_FILE} (`elmo-jax export WORKDIR DIR` "
            f"writes one from a training run; a run's workdir itself also works once it has a checkpoint)"
        )
    raise FileNotFoundError(
        f"{model_dir} has several {keyword} files ({', '.join(candidates)}) and no "
        f"{preferred_name}; pass {'options_file' if keyword == 'options' else 'weight_file'}= explicitly"
    )
