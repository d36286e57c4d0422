"""HIT-SCIR's ELMoForManyLangs models (44 languages), read exactly and converted once.

(Over 500 lines: the released names, the folder's reader, its checks and the conversion to
this package's layout are one format's code; :mod:`~elmo_jax.formats.torch_pickle` already
holds the pickles.)

A model folder of that package holds ``config.json`` (``config_path`` names the
architecture JSON, which may be missing: the package then uses its own ``configs/``, whose
two files :data:`SHIPPED_ARCHITECTURES` repeats), ``char.dic`` and ``word.dic`` (``token<TAB>id``
per line; a line with one field is the ideographic space U+3000) and the PyTorch state dicts
``token_embedder.pkl`` and ``encoder.pkl`` (the released 2018 files in torch's pre-1.6
layout; both layouts are read by :mod:`elmo_jax.formats.torch_pickle`, without torch).

:func:`convert` writes the model in this package's layout: ``options.json`` with a ``vocab``
section (:class:`elmo_jax.config.VocabConfig`), ``weights.hdf5`` (with ``word_embed``) and
the two ``.dic`` files; :func:`cached_conversion` does that once into the model cache, so
later loads read HDF5 only.  The architecture differences are configuration of the one model
(:mod:`elmo_jax.model.encoder`): a word table concatenated before the projection, a char
table from ``char.dic`` with its own width.  The rest maps weight by weight:

* highway: the package computes ``g * x + (1 - g) * relu(A x)`` with ``g = sigmoid(B x)``;
  here ``c * relu(A x) + (1 - c) * x`` with ``c = sigmoid(W_carry x)``, so ``W_carry = -B``;
* LSTM: the package's gates are ``i, f, j, o`` with no constant forget bias; here ``i, j, f,
  o`` with ``+1`` added to ``f`` at run time, so the stored forget bias is the package's - 1;
  its input matmul has no bias and its state matmul has one (here: one bias ``b``).

Tokens become ids as the package's ``read_list`` + ``create_one_batch`` make them
(:class:`VocabIds`): a token longer than ``max_characters_per_token - 2`` characters (code
points) is cut to that many, also before its word is looked up; unknown words and chars
map to ``<oov>``; each token's chars are framed by the ids of ``<eow>`` first and ``<bow>``
last (the package takes the two the other way round, and its models were trained so);
the marker tokens ``<bos>`` / ``<eos>`` carry their own char.  Outputs equal the package's
``Embedder(folder).sents2elmo(sentences, output_layer=k)`` for a fresh ``Embedder`` (its
LSTM state carries over from batch to batch afterwards; here every call starts from zeros,
unless ``embed(..., stateful=True)``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from elmo_jax.atomic import atomic_path, write_json
from elmo_jax.config import CharCNNConfig, ConfigError, ElmoConfig, LSTMConfig, VocabConfig
from elmo_jax.errors import ElmoError
from elmo_jax.formats.torch_pickle import load_state_dict
from elmo_jax.formats.hdf5 import save_weights

CONFIG_FILE = "config.json"
CHAR_DIC = "char.dic"
WORD_DIC = "word.dic"
TOKEN_EMBEDDER_FILE = "token_embedder.pkl"
ENCODER_FILE = "encoder.pkl"
SOURCE_FILE = "manylangs.json"  # written beside a converted model: where it came from

# The two architectures the package ships in elmoformanylangs/configs/ (both hold the same
# numbers); a model whose config.json names one that is not in its folder uses these.
_RELEASED_ARCHITECTURE = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
SHIPPED_ARCHITECTURES = {
    "cnn_50_100_512_4096_sample.json": _RELEASED_ARCHITECTURE,
    "cnn_0_100_512_4096_sample.json": _RELEASED_ARCHITECTURE,
}


class ManyLangsError(ElmoError, ValueError):
    """An ELMoForManyLangs folder that cannot be read as a model."""


def is_manylangs_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` has the package's layout (``config.json`` and its weight files).
    A folder with ``config.json`` and ``char.dic`` but a weight file missing is refused here
    with the names of the missing files (an interrupted copy or unzip)."""
    folder = Path(folder)
    if (
        not (folder / CONFIG_FILE).is_file()
        or not (folder / CHAR_DIC).is_file()
        and not (folder / ENCODER_FILE).is_file()
    ):
        return False
    missing = [n for n in (TOKEN_EMBEDDER_FILE, ENCODER_FILE) if not (folder / n).is_file()]
    if missing and not any(folder.glob("*options*.json")):
        raise ManyLangsError(
            f"{folder} looks like an ELMoForManyLangs model (config.json, char.dic) but "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: copy or unzip "
            f"the model again"
        )
    return not missing


# -- vocabularies ---------------------------------------------------------------------------
def read_dic(path: str | os.PathLike) -> dict[str, int]:
    """A ``.dic`` file as the package reads it: each line stripped of white space and split at
    tabs; a line left with one field (its token was white space) is U+3000; a later line
    for the same token wins.  Lines are split as Python's ``str.splitlines`` splits them,
    as the package's ``codecs`` reader does."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ManyLangsError(
            f"{path} is missing; an ELMoForManyLangs model folder holds {CHAR_DIC} and {WORD_DIC} beside config.json"
        ) from None
    except UnicodeDecodeError as e:
        raise ManyLangsError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    table: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.strip().split("\t")
        if fields == [""]:
            continue
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        try:
            token, index = fields
            table[token] = int(index)
        except ValueError:
            raise ManyLangsError(f"{path}, line {n}: expected 'token<TAB>id', found {line!r}") from None
    return table


def _write_dic(table: dict[str, int], path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for token, index in table.items():
            f.write(f"{token}\t{index}\n")


class VocabIds:
    """Tokens -> ``[word id, char ids]`` rows for a vocabulary model (the ``token_ids`` of
    :class:`elmo_jax.Elmo`; :class:`elmo_jax.chars.ByteIds` is the byte models' one)."""

    def __init__(self, config: ElmoConfig, char2id: dict[str, int], word2id: dict[str, int] | None):
        if config.vocab is None:
            raise ValueError("VocabIds needs a config with a vocab section")
        self.config, self.char2id, self.word2id = config, char2id, word2id
        self.width = config.token_id_width
        self.max_chars = config.char_cnn.max_characters_per_token
        v = config.vocab
        self._begin, self._end, self._bos, self._eos, self._oov, self._pad = v.char_ids
        self._word_oov = v.word_ids[2] if v.word_dim else -1

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, config: ElmoConfig) -> "VocabIds":
        folder = Path(folder)
        char2id = read_dic(folder / CHAR_DIC)
        word2id = read_dic(folder / WORD_DIC) if config.word_dim else None
        assert config.vocab is not None  # a vocabulary model's config (formats.folder checks before it calls)
        for name, table, n in (
            (CHAR_DIC, char2id, config.vocab.n_chars),
            (WORD_DIC, word2id, config.vocab.n_words if config.word_dim else 0),
        ):
            if table is not None and table and (max(table.values()) >= n or min(table.values()) < 0):
                raise ManyLangsError(
                    f"{folder / name} holds ids outside 0..{n - 1}, the rows of the "
                    f"model's table: the file does not belong to these weights"
                )
        return cls(config, char2id, word2id)

    def save(self, folder: str | os.PathLike) -> None:
        _write_dic(self.char2id, Path(folder) / CHAR_DIC)
        if self.word2id is not None:
            _write_dic(self.word2id, Path(folder) / WORD_DIC)

    def _cut(self, token: str) -> str:
        return token if len(token) + 2 <= self.max_chars else token[: self.max_chars - 2]

    def tokens_to_ids(self, tokens: Sequence[str]) -> np.ndarray:
        """int32 ``[len(tokens), 1 + C]``, every id +1 (0 = no token)."""
        out = np.full((len(tokens), self.width), self._pad + 1, np.int32)
        for r, token in enumerate(tokens):
            if isinstance(token, bytes):
                token = token.decode("utf-8", errors="ignore")
            token = self._cut(token)
            out[r, 0] = (self.word2id.get(token, self._word_oov) + 1) if self.word2id is not None else 0
            if token in ("<bos>", "<eos>"):
                row = [self._bos if token == "<bos>" else self._eos]
            else:
                get, oov = self.char2id.get, self._oov
                row = [get(c, oov) for c in token]
            out[r, 1] = self._begin + 1
            out[r, 2 : 2 + len(row)] = np.asarray(row, np.int64) + 1
            out[r, 2 + len(row)] = self._end + 1
        return out

    def batch_to_ids(self, token_lists: Sequence[Sequence[str]], max_length: int | None = None) -> np.ndarray:
        """int32 ``[B, T, 1 + C]``; positions past a sentence's end are 0."""
        width = max((len(t) for t in token_lists), default=0) if max_length is None else max_length
        out = np.zeros((len(token_lists), width, self.width), np.int32)
        index: dict[str, int] = {}
        which = [index.setdefault(t, len(index)) for tokens in token_lists for t in tokens]
        if which:
            rows = self.tokens_to_ids(list(index))[which]
            k = 0
            for b, tokens in enumerate(token_lists):
                out[b, : len(tokens)] = rows[k : k + len(tokens)]
                k += len(tokens)
        return out

    def truncation_message(self, token_lists: Sequence[Sequence[str]]) -> str | None:
        keep = self.max_chars - 2
        cut = [t for tokens in token_lists for t in tokens if len(t) > keep]
        if not cut:
            return None
        return (
            f"{len(cut)} token(s) longer than {keep} characters (the first: {cut[0][:30]!r}) were cut to "
            f"their first {keep}, as ELMoForManyLangs does (its word is looked up cut too). "
            f"Said once per Elmo object."
        )


# -- conversion -----------------------------------------------------------------------------
def read_architecture(folder: str | os.PathLike) -> dict:
    """The architecture JSON ``config.json`` points to: in the folder (by its path, else by its
    file name), else one the package ships (:data:`SHIPPED_ARCHITECTURES`)."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        config_path = meta["config_path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ManyLangsError(
            f"{folder / CONFIG_FILE} is not an ELMoForManyLangs config.json with a "
            f"'config_path' ({type(e).__name__}: {e})"
        ) from None
    name = os.path.basename(str(config_path).replace("\\", "/"))
    for candidate in (folder / str(config_path), folder / name):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text(encoding="utf-8"))
            except ValueError as e:
                raise ManyLangsError(f"{candidate} is not valid JSON ({e})") from None
    if name in SHIPPED_ARCHITECTURES:
        return json.loads(json.dumps(SHIPPED_ARCHITECTURES[name]))
    raise ManyLangsError(
        f"{folder / CONFIG_FILE} names the architecture {config_path!r}, which is neither in "
        f"the folder nor one the package ships ({', '.join(SHIPPED_ARCHITECTURES)}); put "
        f"that JSON file in {folder}"
    )


def elmo_config(architecture: dict, char2id: dict[str, int], word2id: dict[str, int] | None, source: str) -> ElmoConfig:
    """The architecture JSON and the vocabularies as an :class:`ElmoConfig` with a vocab."""
    try:
        enc, tok = architecture["encoder"], architecture["token_embedder"]
        if str(enc["name"]).lower() != "elmo" or str(tok["name"]).lower() != "cnn":
            raise ManyLangsError(
                f"{source}: encoder {enc['name']!r} with token_embedder {tok['name']!r}; only the 'elmo' "
                f"encoder with the 'cnn' token embedder (every released model) is supported"
            )
        if tok["char_dim"] <= 0:
            raise ManyLangsError(
                f"{source}: char_dim is {tok['char_dim']}; models without the char CNN are not supported"
            )
        word_dim = int(tok["word_dim"])

        def need(table, name, keys):
            missing = [k for k in keys if k not in table]
            if missing:
                raise ManyLangsError(f"{source}: {name} has no {', '.join(missing)} entry, which the package requires")
            return tuple(table[k] for k in keys)

        # create_one_batch begins a word with the id of <eow> and ends it with that of <bow>.
        char_ids = need(char2id, CHAR_DIC, ("<eow>", "<bow>", "<bos>", "<eos>", "<oov>", "<pad>"))
        n_chars = len(char2id)  # the package sizes its tables by the entries, not the ids
        vocab = VocabConfig(
            n_chars=n_chars,
            char_ids=char_ids,
            # word2id is read whenever word_dim is set; were it None, len's TypeError is reported below
            n_words=len(cast("dict[str, int]", word2id)) if word_dim else 0,
            word_dim=word_dim,
            word_ids=need(word2id, WORD_DIC, ("<bos>", "<eos>", "<oov>", "<pad>")) if word_dim else (),
        )
        clip = lambda v: float(v) if v else None  # noqa: E731 - the package clips only when truthy
        return ElmoConfig(
            char_cnn=CharCNNConfig(
                embedding_dim=int(tok["char_dim"]),
                filters=tuple((int(w), int(n)) for w, n in tok["filters"]),
                n_highway=int(tok["n_highway"]),
                activation=str(tok["activation"]),
                max_characters_per_token=int(tok["max_characters_per_token"]),
                n_characters=n_chars + 1,
            ),
            lstm=LSTMConfig(
                dim=int(enc["dim"]),
                projection_dim=int(enc["projection_dim"]),
                n_layers=int(enc["n_layers"]),
                cell_clip=clip(enc.get("cell_clip")),
                proj_clip=clip(enc.get("proj_clip")),
                use_skip_connections=True,
            ),
            vocab=vocab,
        )
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ElmoError):
            raise
        raise ManyLangsError(f"{source}: not an ELMoForManyLangs architecture ({type(e).__name__}: {e})") from None


def params_from_state_dicts(config: ElmoConfig, token_sd: dict, encoder_sd: dict, source: str) -> dict:
    """The two state dicts as this package's parameter pytree (numpy, float32)."""
    c, l = config.char_cnn, config.lstm
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731

    def get(sd, name, shape, file):
        if name not in sd:
            raise ManyLangsError(
                f"{source}: {file} has no tensor {name!r}; is it an ELMoForManyLangs {file}, for this config.json?"
            )
        if tuple(sd[name].shape) != tuple(shape):
            raise ManyLangsError(
                f"{source}: {file} tensor {name!r} has shape {tuple(sd[name].shape)}, expected "
                f"{tuple(shape)} from the architecture and the .dic files"
            )
        return f32(sd[name])

    tok = lambda name, shape: get(token_sd, name, shape, TOKEN_EMBEDDER_FILE)  # noqa: E731
    enc = lambda name, shape: get(encoder_sd, name, shape, ENCODER_FILE)  # noqa: E731
    v, f, d = config.vocab, c.n_filters, c.embedding_dim
    assert v is not None  # a vocabulary model's config (elmo_config made it)
    table = tok("char_emb_layer.embedding.weight", (v.n_chars, d))
    params: dict = {"char_embed": np.concatenate([np.zeros((1, d), np.float32), table])}
    params["cnn"] = [
        {"w": tok(f"convolutions.{i}.weight", (n, d, w)).transpose(2, 1, 0), "b": tok(f"convolutions.{i}.bias", (n,))}
        for i, (w, n) in enumerate(c.filters)
    ]
    params["highway"] = []
    for k in range(c.n_highway):
        w, b = tok(f"highways._layers.{k}.weight", (2 * f, f)), tok(f"highways._layers.{k}.bias", (2 * f,))
        params["highway"].append(
            {"w_transform": w[:f].T.copy(), "b_transform": b[:f].copy(), "w_carry": -w[f:].T, "b_carry": -b[f:]}
        )
    if v.word_dim:
        words = tok("word_emb_layer.embedding.weight", (v.n_words, v.word_dim))
        params["word_embed"] = np.concatenate([np.zeros((1, v.word_dim), np.float32), words])
    params["proj"] = {
        "w": tok("projection.weight", (l.projection_dim, config.projection_input_dim)).T.copy(),
        "b": tok("projection.bias", (l.projection_dim,)),
    }
    h, p = l.dim, l.projection_dim
    layers = []
    for n in range(l.n_layers):
        per_direction = []
        for direction in ("forward", "backward"):
            pre = f"{direction}_layer_{n}"
            w_x = enc(f"{pre}.input_linearity.weight", (4 * h, p))
            w_h = enc(f"{pre}.state_linearity.weight", (4 * h, p))
            b = enc(f"{pre}.state_linearity.bias", (4 * h,))
            w_p = enc(f"{pre}.state_projection.weight", (p, h))
            i, fg, j, o = (slice(k * h, (k + 1) * h) for k in range(4))
            order = lambda a: np.concatenate([a[i], a[j], a[fg], a[o]])  # noqa: E731, B023 - i f j o -> i j f o; used in this pass only
            bias = order(b)
            bias[2 * h : 3 * h] -= 1.0  # the forget bias 1.0 is added at run time here
            per_direction.append({"w_x": order(w_x).T, "w_h": order(w_h).T, "b": bias, "w_p": w_p.T})
        layers.append({k: np.stack([pd[k] for pd in per_direction]) for k in per_direction[0]})
    params["lstm"] = layers
    return params


def convert(folder: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write the ELMoForManyLangs model in ``folder`` to ``out_dir`` in this package's layout
    (``options.json``, ``weights.hdf5``, ``char.dic``, ``word.dic``, ``manylangs.json``)."""
    folder, out_dir = Path(folder), Path(out_dir)
    architecture = read_architecture(folder)
    char2id = read_dic(folder / CHAR_DIC)
    word_dim = architecture.get("token_embedder", {}).get("word_dim", 0) if isinstance(architecture, dict) else 0
    word2id = read_dic(folder / WORD_DIC) if word_dim else None
    config = elmo_config(architecture, char2id, word2id, str(folder))
    params = params_from_state_dicts(
        config, load_state_dict(folder / TOKEN_EMBEDDER_FILE), load_state_dict(folder / ENCODER_FILE), str(folder)
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_weights(params, config, out_dir / "weights.hdf5")
    VocabIds(config, char2id, word2id).save(out_dir)
    config.to_json_file(out_dir / "options.json")
    write_json(
        out_dir / SOURCE_FILE,
        {"converted_from": str(folder.resolve()), "format": "ELMoForManyLangs", "architecture": architecture},
    )
    return out_dir


def _fingerprint(folder: Path) -> str:
    """Changes whenever one of the model's files does (path, size and modification time)."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    for name in sorted(os.listdir(folder)):
        p = folder / name
        if p.is_file():
            st = p.stat()
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def cached_conversion(folder: str | os.PathLike, models_dir: str | os.PathLike) -> Path:
    """The converted copy of the ELMoForManyLangs ``folder`` in ``models_dir`` (the resolver
    passes the model cache), converting it on first use (and again after any of its files
    changed); complete or absent."""
    folder = Path(folder)
    models_dir = Path(models_dir)
    entry = models_dir / f"manylangs-{folder.resolve().name[:32]}-{_fingerprint(folder)}"
    if (entry / "options.json").is_file():
        return entry
    models_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(str(entry) + f".tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        convert(folder, staging)
        try:
            os.rename(staging, entry)
        except OSError:  # another process converted it first
            if not (entry / "options.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def config_fields(config: ElmoConfig) -> dict:
    """The architecture of a vocabulary model without its vocabularies' sizes and ids (what
    every released model shares)."""
    options = config.to_options()
    options["char_cnn"].pop("n_characters", None)
    vocab = options.pop("vocab", None) or {}
    options["word_dim"] = vocab.get("word_dim", "no vocab section")
    return options


def released_config_fields() -> dict:
    """:func:`config_fields` of the released models' architecture."""
    chars = {k: i for i, k in enumerate(("<bow>", "<eow>", "<bos>", "<eos>", "<oov>", "<pad>"))}
    words = {k: i for i, k in enumerate(("<bos>", "<eos>", "<oov>", "<pad>"))}
    return config_fields(elmo_config(_RELEASED_ARCHITECTURE, chars, words, "released architecture"))


def check_vocab_files(folder: str | os.PathLike, config: ElmoConfig) -> None:
    """Refuse a converted folder whose ``.dic`` files are missing."""
    missing = [n for n in (CHAR_DIC, WORD_DIC)[: 1 + bool(config.word_dim)] if not (Path(folder) / n).is_file()]
    if missing:
        raise ConfigError(
            f"{folder}: options.json has a vocab section but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing beside it; convert the "
            f"ELMoForManyLangs folder again (Elmo.load(its folder))"
        )


__all__ = [
    "VocabIds",
    "cached_conversion",
    "convert",
    "is_manylangs_folder",
    "read_dic",
]
