"""ELMo as a Flax NNX layer: a pretrained biLM that a task model mixes and learns from.

    from flax import nnx
    from elmo_jax.nnx import ElmoLayer, batch_inputs

    elmo = ElmoLayer("path/to/model", num_output_representations=2, rngs=nnx.Rngs(0))
    char_ids, mask = batch_inputs([["She", "went", "."], ["Hi"]], elmo.config)
    x_BTD, y_BTD = elmo(char_ids, mask)          # two mixes [B, T, 2P], zero past each sentence
    optimizer = nnx.Optimizer(task_model, optax.adam(1e-3), wrt=nnx.Param)  # the biLM stays as it is

* The biLM's weights live in :class:`ElmoWeight` variables (frozen, the default): they are
  not ``nnx.Param``, so ``nnx.grad`` (which differentiates ``nnx.Param``) gives them no
  gradient, ``nnx.Optimizer(..., wrt=nnx.Param)`` keeps no state for them, and
  ``nnx.state(model, nnx.Param)`` (what a checkpoint of the task model holds) leaves them
  out.  The layers are also computed under ``stop_gradient``, so no backward pass runs
  through the LSTMs even for a ``wrt`` that names ``ElmoWeight``.  ``trainable=True``
  holds them as ``nnx.Param`` instead: the whole biLM is fine-tuned with the task.
* Each of the ``num_output_representations`` outputs is its own :class:`ScalarMix` of the
  ``L+1`` layers (the paper feeds one mix at the input of the task RNN and one at its
  output), with optional layer norm over the real tokens, followed by dropout on the mixed
  vector (the paper's "moderate amount of dropout": ``dropout``, 0.5 by default as in
  AllenNLP; off after
  ``model.eval()`` or with ``deterministic=True``).
* :class:`ScalarMix` and :class:`ComponentHead` call the pure functions of
  :mod:`elmo_jax.model.heads`; :mod:`elmo_jax.finetune` uses the same functions, and a
  ScalarMix trained there loads here (``ScalarMix(n, params=result.params["mix"])``).
* Compilation: ``nnx.jit`` compiles once per input shape; :func:`batch_inputs` pads the
  time axis to the buckets of :meth:`elmo_jax.Elmo.embed` (6, 10, 14, 22, 30, 46, ...) and
  the rows to a power of two, so sentences of up to ``m`` tokens in batches of up to ``b``
  compile at most ``len(time_buckets(m)) * n_row_buckets(b)`` times.
* :func:`save_params` / :func:`restore_params`: the task model's ``nnx.Param`` state with
  orbax, plus a fingerprint of each frozen biLM, so a checkpoint restored beside other
  frozen weights than it was trained with is refused instead of silently mixed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from elmo_jax import chars
from elmo_jax.atomic import replace_dir
from elmo_jax.config import ElmoConfig
from elmo_jax.embedding.embedder import Elmo, Sentence, row_bucket, time_bucket
from elmo_jax.errors import ElmoError
from elmo_jax.model import heads
from elmo_jax.model.bilm import bilm
from elmo_jax.storage_echoes import drop_closed_loop_echoes, drop_failed_read_echoes

LINEN_COLLECTION = "elmo_weights"
"""The Linen collection that frozen biLM weights land in under ``nnx.bridge.to_linen``
(trainable ones are in ``"params"``)."""


class ElmoWeight(nnx.Variable):
    """A weight of a frozen biLM: not an ``nnx.Param``, so ``nnx.grad`` and
    ``nnx.Optimizer(..., wrt=nnx.Param)`` leave it alone."""


nnx.register_variable_name(LINEN_COLLECTION, ElmoWeight, overwrite=True)


def _values(tree):
    """A pytree of variables -> the same pytree of their arrays."""
    return jax.tree.map(lambda v: v[...], tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


class ScalarMix(nnx.Module):
    """``[L, B, T, D] -> [B, T, D]``: :func:`elmo_jax.model.heads.scalar_mix` with trainable
    ``scalars [L]`` and ``gamma``; ``layer_norm`` normalises each layer over the real
    tokens (``mask_BT``) first.  ``params`` starts it from a trained mix
    (``{"scalars", "gamma"}``, e.g. ``result.params["mix"]`` of :mod:`elmo_jax.finetune`)."""

    def __init__(self, n_layers: int, *, layer_norm: bool = False, gamma: float = 1.0, params: dict | None = None):
        init = heads.scalar_mix_init(n_layers, gamma) if params is None else params
        scalars = jnp.asarray(init["scalars"], jnp.float32)
        if scalars.shape != (n_layers,):
            raise ValueError(
                f"ScalarMix({n_layers}): params['scalars'] has shape {scalars.shape}, "
                f"expected ({n_layers},), one weight per layer"
            )
        self.scalars = nnx.Param(scalars)
        self.gamma = nnx.Param(jnp.asarray(init.get("gamma", gamma), jnp.float32))
        self.layer_norm = layer_norm

    def params_dict(self) -> dict:
        """``{"scalars": [L], "gamma": ()}``, the form the pure functions and
        ``Elmo.embed(..., layers="mix", mix_params=...)`` take."""
        return {"scalars": self.scalars[...], "gamma": self.gamma[...]}

    def __call__(self, layers_LBTD: jax.Array, mask_BT: jax.Array | None = None) -> jax.Array:
        return heads.scalar_mix(self.params_dict(), layers_LBTD, mask_BT, layer_norm=self.layer_norm)

    def penalty(self) -> jax.Array:
        """The paper's L2 penalty on the layer weights, ``sum(s ** 2)``."""
        return heads.scalar_mix_penalty(self.params_dict())


class ComponentHead(nnx.Module):
    """``[L+1, B, T, 2P] -> [B, T, out_dim]``: :func:`elmo_jax.model.heads.component_head`,
    the ``1 + 2L`` components (token, forward 1..L, backward 1..L) concatenated and
    multiplied by one trainable ``[(1 + 2L) P, out_dim]`` matrix.  Feed it
    :meth:`ElmoLayer.all_layers`."""

    def __init__(self, config: ElmoConfig, out_dim: int = 512, *, rngs: nnx.Rngs):
        self.w = nnx.Param(heads.component_head_init(rngs.params(), config, out_dim)["w"])

    def __call__(self, layers_LBTD: jax.Array) -> jax.Array:
        return heads.component_head({"w": self.w[...]}, layers_LBTD)


class ElmoLayer(nnx.Module):
    """A pretrained biLM and ``num_output_representations`` trainable mixes of its layers.

    ``model``: a loaded :class:`elmo_jax.Elmo`, or anything :meth:`elmo_jax.Elmo.load`
    takes (a model folder, or a released model's name where that is supported); its
    compute dtype is kept (``dtype`` overrides it when loading here).  ``trainable``:
    hold the biLM as ``nnx.Param`` and fine-tune it (default: frozen :class:`ElmoWeight`).
    ``layer_norm``: each mix normalises the layers over the real tokens first.
    ``dropout``: the rate on each mixed vector (0 disables it).  ``progress=False``: no
    progress bar while a named model downloads.

    Call with char ids ``[B, T, C]`` (:func:`batch_inputs`) and optionally the mask
    ``[B, T]`` of real tokens (each row's first ``n`` positions; by default the positions
    whose char ids are not all zero).  Returns a tuple of ``num_output_representations``
    arrays ``[B, T, 2P]``, zero at padding.
    """

    def __init__(
        self,
        model: Elmo | str | os.PathLike,
        *,
        num_output_representations: int = 1,
        trainable: bool = False,
        layer_norm: bool = False,
        dropout: float = 0.5,
        dtype: str | None = None,
        progress: bool = True,
        rngs: nnx.Rngs,
    ):
        if not isinstance(model, Elmo):
            if not isinstance(model, (str, os.PathLike)):
                raise TypeError(
                    f"ElmoLayer takes an elmo_jax.Elmo, a model folder or a model name, got {type(model).__name__}"
                )
            model = Elmo.load(model, dtype=dtype or "float32", progress=progress)
        if num_output_representations < 1:
            raise ValueError(
                f"num_output_representations must be >= 1, got {num_output_representations}; "
                f"for the raw layers call ElmoLayer.all_layers"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout is a rate in [0, 1), got {dropout}")
        self.config = model.config
        self.token_ids = model.token_ids  # tokens -> ids (batch_inputs(sentences, layer))
        self.dtype = model.dtype
        self.trainable = trainable
        kind = nnx.Param if trainable else ElmoWeight
        self.bilm = nnx.data(jax.tree.map(lambda a: kind(jnp.asarray(a)), model.params))
        self.mixes = nnx.List(
            [ScalarMix(self.config.n_output_layers, layer_norm=layer_norm) for _ in range(num_output_representations)]
        )
        # Under nnx.bridge.to_linen the streams are Linen's: "dropout" exists only when
        # apply(..., rngs={"dropout": key}) gives it (deterministic calls need none).  The
        # bridge adds a "default" stream seeded 0 to every apply, and the layer is rebuilt at
        # each one: masks drawn from it would be the same on every call, so it is not used.
        linen = _under_linen()
        streams = ("dropout",) if linen else ("dropout", "default")
        has_stream = any(name in rngs for name in streams)
        if dropout > 0 and not linen and not has_stream:
            raise ValueError(
                f"ElmoLayer(dropout={dropout}) draws dropout masks from the rngs' 'dropout' (or 'default') "
                f"stream, and these rngs have neither: pass e.g. nnx.Rngs(0) or nnx.Rngs(params=0, dropout=1), "
                f"or dropout=0.0"
            )
        self.dropout = nnx.Dropout(dropout, rngs=rngs) if has_stream else nnx.Dropout(dropout)
        self.linen_without_dropout_rng = linen and not has_stream

    def all_layers(self, char_ids_BTC: jax.Array, mask_BT: jax.Array | None = None) -> jax.Array:
        """The biLM's layers ``[L+1, B, T, 2P]`` (0 = ``[e; e]``, ``l`` = ``[forward_l;
        backward_l]``), zero past each sentence; frozen unless ``trainable``."""
        char_ids_BTC = jnp.asarray(char_ids_BTC)
        n_chars = self.config.token_id_width
        if char_ids_BTC.ndim != 3 or char_ids_BTC.shape[-1] != n_chars:
            raise ValueError(
                f"char ids must be [B, T, {n_chars}] (batch_inputs(sentences, layer) "
                f"builds them), got shape {char_ids_BTC.shape}"
            )
        lengths_B = None
        if mask_BT is not None:
            if jnp.shape(mask_BT) != char_ids_BTC.shape[:2]:
                raise ValueError(f"mask must be [B, T] = {char_ids_BTC.shape[:2]}, got {jnp.shape(mask_BT)}")
            lengths_B = jnp.sum(jnp.asarray(mask_BT, jnp.int32), axis=1)
        layers_LBTD, _ = bilm(_values(self.bilm), self.config, char_ids_BTC, None, lengths_B, dtype=self.dtype)
        return layers_LBTD if self.trainable else jax.lax.stop_gradient(layers_LBTD)

    def __call__(
        self, char_ids_BTC: jax.Array, mask_BT: jax.Array | None = None, *, deterministic: bool | None = None
    ) -> tuple[jax.Array, ...]:
        if self.linen_without_dropout_rng and self.dropout.rate > 0:
            if not (self.dropout.deterministic if deterministic is None else deterministic):
                raise ElmoError(
                    f"ElmoLayer (dropout {self.dropout.rate}) under nnx.bridge.to_linen was applied without a "
                    f"dropout rng and without deterministic: pass rngs={{'dropout': key}} to init/apply when "
                    f"training (a new key each step), or deterministic=True when evaluating"
                )
        layers_LBTD = self.all_layers(char_ids_BTC, mask_BT)
        if mask_BT is None:
            mask_BT = jnp.any(jnp.asarray(char_ids_BTC) > 0, axis=-1)
        real_BT1 = jnp.asarray(mask_BT, jnp.float32)[..., None]
        return tuple(
            self.dropout(mix(layers_LBTD, mask_BT) * real_BT1, deterministic=deterministic) for mix in self.mixes
        )

    def penalty(self) -> jax.Array:
        """The sum of the mixes' L2 penalties on their layer weights (the paper adds it to
        the task loss with a small factor, e.g. 1e-3)."""
        # an array: there is at least one mix (__init__ checks), so never sum's start value 0
        return cast(jax.Array, sum(mix.penalty() for mix in self.mixes))

    def fingerprint(self) -> str:
        """SHA-256 of the biLM's configuration and weights (what :func:`restore_params`
        compares for a frozen biLM)."""
        h = hashlib.sha256(json.dumps(self.config.to_options(), sort_keys=True).encode())
        for path, v in jax.tree_util.tree_leaves_with_path(_values(self.bilm)):
            a = np.ascontiguousarray(np.asarray(v))
            h.update(f"{jax.tree_util.keystr(path)}:{a.dtype}:{a.shape}".encode())
            h.update(a.tobytes())
        return h.hexdigest()


def _under_linen() -> bool:
    """True while a Linen module is being called (``nnx.bridge.to_linen`` builds the layer
    inside one, with Linen's rng streams)."""
    try:
        from flax.linen.module import _context
    except ImportError:
        return False
    stack: Any = getattr(_context, "module_stack", None)  # Linen's private list of modules, if it has one
    return bool(stack) and stack[-1] is not None


def batch_inputs(
    sentences: Sequence[Sentence], config: ElmoConfig | ElmoLayer | Elmo, *, rows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sentences (strings split on whitespace, or token lists) -> ``(char_ids [R, T, C]
    int32, mask [R, T] bool)``.

    ``config``: the model's :class:`ElmoConfig`, or the :class:`ElmoLayer` / ``Elmo`` itself,
    which a vocabulary model (ELMoForManyLangs, ``config.vocab``) needs: its ids come from its
    ``.dic`` files (``C`` is then ``1 + max_characters_per_token``).

    ``T`` is the time bucket of the longest sentence (as :meth:`elmo_jax.Elmo.embed` pads
    it); ``R`` is ``rows`` if given (at least the number of sentences), else the next power
    of two.  Padding rows and positions are zero in both arrays, so the layer's outputs
    there are zero too.
    """
    if isinstance(sentences, (str, bytes)):
        raise TypeError("batch_inputs takes a list of sentences; wrap a single sentence as [sentence]")
    token_lists = [chars.tokenize(s) for s in sentences]
    if not token_lists:
        raise ValueError("batch_inputs: no sentences")
    n = len(token_lists)
    if rows is None:
        rows = row_bucket(n, 1 << max(0, n - 1).bit_length())
    elif rows < n:
        raise ValueError(f"rows={rows} is fewer than the {n} sentences")
    n_time = time_bucket(max(len(t) for t in token_lists))
    token_ids = getattr(config, "token_ids", None)
    model_config = cast(ElmoConfig, getattr(config, "config", config))  # the layer's or Elmo's, or config itself
    if token_ids is None:
        if model_config.vocab is not None:
            raise ValueError(
                "a vocabulary model's ids come from its .dic files: call batch_inputs(sentences, "
                "layer) with the ElmoLayer (or the Elmo), not its config"
            )
        token_ids = chars.ByteIds(model_config.char_cnn.max_characters_per_token)
    ids = np.zeros((rows, n_time, model_config.token_id_width), np.int32)
    ids[:n] = token_ids.batch_to_ids(token_lists, max_length=n_time)
    mask = np.zeros((rows, n_time), bool)
    for i, t in enumerate(token_lists):
        mask[i, : len(t)] = True
    return ids, mask


def parameter_counts(model: nnx.Module) -> tuple[int, int]:
    """``(trainable, frozen)``: the number of scalars in ``nnx.Param`` and in
    :class:`ElmoWeight` variables of ``model``."""

    def count(kind) -> int:
        return int(sum(np.size(v) for v in jax.tree.leaves(nnx.state(model, kind))))

    return count(nnx.Param), count(ElmoWeight)


def _frozen_layers(model: nnx.Module) -> dict[str, ElmoLayer]:
    return {
        "/".join(map(str, path)): m for path, m in nnx.iter_graph(model) if isinstance(m, ElmoLayer) and not m.trainable
    }


# What save_params writes into its folder (orbax's layout); nothing else may be replaced.
_SAVED_ENTRIES = {"meta", "params", "_CHECKPOINT_METADATA", "commit_success.txt"}


def save_params(model: nnx.Module, directory: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Write ``nnx.state(model, nnx.Param)`` to ``directory`` with orbax (atomically: a
    temporary folder renamed into place), plus a fingerprint of each frozen
    :class:`ElmoLayer` (its weights are not written: they stay in the model folder they
    were loaded from).  A trainable biLM is a ``Param`` and is saved with the rest."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory):
        if not overwrite:
            raise FileExistsError(f"{directory} already exists; pass overwrite=True to replace it")
        others = sorted(set(os.listdir(directory)) - _SAVED_ENTRIES) if os.path.isdir(directory) else [directory]
        if others:
            raise FileExistsError(
                f"{directory} holds files that save_params did not write ({', '.join(others)}); overwrite=True "
                f"replaces the whole folder and would delete them: choose another folder"
            )
    meta = {"frozen_elmo": {path: layer.fingerprint() for path, layer in _frozen_layers(model).items()}}
    tmp = f"{directory}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckpt:
            ckpt.save(
                tmp,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(nnx.state(model, nnx.Param)), meta=ocp.args.JsonSave(meta)
                ),
            )
        replace_dir(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def restore_params(model: nnx.Module, directory: str | os.PathLike) -> None:
    """Load what :func:`save_params` wrote into ``model`` (built as the saved one was, from
    the same biLM).  Refuses a checkpoint whose frozen biLMs differ from the model's."""
    import orbax.checkpoint as ocp

    directory = os.path.abspath(os.fspath(directory))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoint folder at {directory}")
    drop_closed_loop_echoes()  # a refused restore's late echoes (see elmo_jax.storage_echoes)
    target = nnx.state(model, nnx.Param)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), target)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckpt:
        meta = ckpt.restore(directory, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        saved = meta.get("frozen_elmo", {})
        current = {path: layer.fingerprint() for path, layer in _frozen_layers(model).items()}
        if saved != current:
            raise ElmoError(
                f"{directory} was saved beside other frozen biLM weights than this model holds "
                f"(saved: {json.dumps(saved)}, model: {json.dumps(current)}); build the model from the "
                f"ELMo it was trained with (same folder or name, same trainable= setting)"
            )
        drop_failed_read_echoes(directory)  # a refused restore's reads' late logs, from their start
        try:
            restored = ckpt.restore(directory, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract)))[
                "params"
            ]
        except (ValueError, KeyError) as e:
            raise ElmoError(
                f"{directory} does not fit this model's parameters ({e}); build the task "
                f"model with the same layers and sizes as the one saved"
            ) from None
    nnx.update(model, restored)


__all__ = [
    "ElmoLayer",
    "ElmoWeight",
    "ScalarMix",
    "ComponentHead",
    "batch_inputs",
    "parameter_counts",
    "save_params",
    "restore_params",
    "LINEN_COLLECTION",
]
