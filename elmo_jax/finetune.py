"""Train a small task head on frozen ELMo: token-level tagging.

The biLM is never updated.  Two ways to feed it:

* **precomputed** (small data, fastest): :func:`pad_layers` turns ``elmo.embed(...)``
  output into ``layers [L+1, N, T, 2P]`` once, and the train step reads slices of it;
* **on the fly** (data too big to precompute): :func:`make_train_step` with
  ``on_the_fly=True`` takes char ids and runs the biLM inside the step under
  ``jax.lax.stop_gradient``; the gradient is taken with respect to the head alone.

Either way ``jax.value_and_grad`` differentiates only the head parameters (argument 0),
so the gradient pytree holds exactly the head's leaves and the optimiser state covers
only them.

Heads (``head=``):

* ``"mix"`` — the paper's ScalarMix (:func:`elmo_jax.model.heads.scalar_mix`) with its L2
  penalty on the layer weights (``penalty * sum(s**2)``), then the classifier;
* ``"mix:layer_norm"`` — the same, each layer first normalised to zero mean and unit
  variance over the batch's real tokens (the paper's optional layer norm; statistics come
  from the batch, as in AllenNLP's ScalarMix, so predictions depend a little on which
  sentences share a batch).  Its parameters are those of ``"mix"``;
* ``"components"`` — the 5-component head
  (:func:`elmo_jax.model.heads.component_head`, the ``1 + 2L`` components times one
  matrix to ``out_dim``), then the classifier;
* ``"layer:K"`` — layer ``K`` as is (a fixed probe), then the classifier.

The classifier is one dense layer to ``n_classes`` logits; the loss is the mean token
cross-entropy over real (unmasked) tokens.  Example::

    layers, mask = pad_layers(elmo.embed(train_sentences))
    y = pad_labels(train_tags, class_index, layers.shape[2])
    head = init_tagger(jax.random.key(0), elmo.config, n_classes, "mix")
    result = train_tagger(head, layers, y, mask, "mix", optax.adam(1e-2), steps=300)
    accuracy(result.params, test_layers, test_y, test_mask, "mix")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.config import ElmoConfig
from elmo_jax.model import heads
from elmo_jax.model.bilm import bilm
from elmo_jax.train.losses import masked_mean


DEFAULT_PENALTY = 1e-3
"""The L2 penalty on a ``"mix"`` head's layer weights unless one is given (the paper's
small lambda, 0.001, which it compares with 1); the other heads have none.  The same
default for :func:`tagger_loss`, :func:`make_train_step` and :func:`train_tagger`."""


def _parse_head(head: str) -> tuple[str, int | None, bool]:
    """``head`` -> ``(kind, layer, layer_norm)``."""
    if head in ("mix", "components"):
        return head, None, False
    if head == "mix:layer_norm":
        return "mix", None, True
    if isinstance(head, str) and head.startswith("layer:"):
        try:
            return "layer", int(head.split(":", 1)[1]), False
        except ValueError:
            pass
    raise ValueError(f'head must be "mix", "mix:layer_norm", "components" or "layer:K", got {head!r}')


def init_tagger(key: jax.Array, config: ElmoConfig, n_classes: int, head: str = "mix", out_dim: int = 512) -> dict:
    """Head parameters: ``{"mix"|"components": ..., "classifier": {"w", "b"}}``."""
    kind, layer, _ = _parse_head(head)
    if kind == "layer":
        assert layer is not None  # a "layer:K" head has one
        if not 0 <= layer < config.n_output_layers:
            raise ValueError(f"layer {layer} does not exist: the model has layers 0..{config.n_output_layers - 1}")
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes}")
    k_head, k_cls = jax.random.split(key)
    params: dict = {}
    width = config.output_dim
    if kind == "mix":
        params["mix"] = heads.scalar_mix_init(config.n_output_layers)
    elif kind == "components":
        params["components"] = heads.component_head_init(k_head, config, out_dim)
        width = out_dim
    bound = (6.0 / (width + n_classes)) ** 0.5
    params["classifier"] = {
        "w": jax.random.uniform(k_cls, (width, n_classes), minval=-bound, maxval=bound),
        "b": jnp.zeros((n_classes,)),
    }
    return params


def _layout_error(shape) -> ValueError:
    return ValueError(
        f"layers must be [L+1, N, T, 2P] (pad_layers(elmo.embed(...)) builds them), got shape {tuple(shape)}"
    )


def _head_of(params: dict) -> str:
    """Which head ``params`` were initialised for (as :func:`init_tagger` names its keys)."""
    return "mix" if "mix" in params else "components" if "components" in params else "layer:K"


def tagger_logits(params: dict, layers_LBTD: jax.Array, head: str, mask_BT: jax.Array | None = None) -> jax.Array:
    """``[L+1, B, T, 2P] -> [B, T, n_classes]``.  Shapes and the head are checked when
    traced (they are static), values are not (see :func:`check_tagging_data`).

    ``mask_BT`` (real tokens) matters only to ``"mix:layer_norm"``, whose statistics are
    taken over the real tokens of the batch; None counts every position."""
    kind, layer, layer_norm = _parse_head(head)
    if layers_LBTD.ndim < 3:  # [L+1, ..., 2P]: one sentence [L+1, T, 2P] works for every head
        raise _layout_error(layers_LBTD.shape)
    made_for = _head_of(params)
    if made_for != (kind if kind != "layer" else "layer:K"):
        raise ValueError(
            f"params were initialised for head {made_for!r}, not {head!r}: call "
            f"init_tagger(..., head={head!r}) for this head"
        )
    if kind == "mix":
        x = heads.scalar_mix(params["mix"], layers_LBTD, mask_BT, layer_norm=layer_norm)
    elif kind == "components":
        x = heads.component_head(params["components"], layers_LBTD)
    else:
        assert layer is not None  # a "layer:K" head has one
        if not 0 <= layer < layers_LBTD.shape[0]:
            raise ValueError(
                f"head {head!r}: layer {layer} does not exist, the layers are "
                f"0..{layers_LBTD.shape[0] - 1} (layers are [L+1, N, T, 2P], layers first)"
            )
        x = layers_LBTD[layer]
    return x @ params["classifier"]["w"] + params["classifier"]["b"]


def check_tagging_data(params: dict, layers_LNTD, labels_NT, mask_NT) -> None:
    """Host-side checks of a tagging data set against the head (what the compiled functions
    cannot see): matching ``[N, T]`` shapes, and a label in ``0..n_classes-1`` for every
    real token (``pad_labels`` writes -1 where a sentence has fewer tags than tokens)."""
    layers_shape = tuple(np.shape(layers_LNTD))
    if len(layers_shape) != 4:
        raise _layout_error(layers_shape)
    labels, mask = np.asarray(labels_NT), np.asarray(mask_NT, bool)
    if labels.shape != layers_shape[1:3] or mask.shape != layers_shape[1:3]:
        raise ValueError(
            f"labels {labels.shape} and mask {mask.shape} must both be [N, T] = "
            f"{layers_shape[1:3]}, the sentences and steps of layers {layers_shape}"
        )
    n_classes = int(np.shape(params["classifier"]["b"])[0])
    bad = mask & ((labels < 0) | (labels >= n_classes))
    if bad.any():
        i, t = (int(v) for v in np.argwhere(bad)[0])
        if labels[i, t] < 0:
            raise ValueError(
                f"sentence {i}: token {t} has no label (it has fewer tags than tokens); give one tag per token"
            )
        raise ValueError(
            f"sentence {i}, token {t}: label {int(labels[i, t])} is not a class of this head "
            f"(n_classes={n_classes}); init_tagger(..., n_classes) must cover every label"
        )


def tagger_loss(
    params: dict,
    layers_LBTD: jax.Array,
    labels_BT: jax.Array,
    mask_BT: jax.Array,
    head: str,
    penalty: float = DEFAULT_PENALTY,
) -> jax.Array:
    """Mean cross-entropy over real tokens (+ ``penalty * sum(s**2)`` for ``"mix"``)."""
    logits = tagger_logits(params, layers_LBTD, head, mask_BT)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels_BT, 0))
    loss = masked_mean(ce, mask_BT)
    if "mix" in params and penalty:
        loss = loss + penalty * heads.scalar_mix_penalty(params["mix"])
    return loss


def frozen_layers(bilm_params: dict, config: ElmoConfig, char_ids_BTC: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """The biLM's layers with the gradient cut: nothing flows back into ``bilm_params``."""
    layers, _ = bilm(bilm_params, config, char_ids_BTC, None, lengths_B)
    return jax.lax.stop_gradient(layers)


def make_train_step(
    head: str,
    optimizer: optax.GradientTransformation,
    penalty: float = DEFAULT_PENALTY,
    *,
    config: ElmoConfig | None = None,
    on_the_fly: bool = False,
) -> Callable:
    """A jit-compiled ``step(params, opt_state, batch, bilm_params=None) ->
    (params, opt_state, loss, grads)``.

    ``batch``: ``{"layers", "labels", "mask"}`` (precomputed) or, with ``on_the_fly``,
    ``{"char_ids", "lengths", "labels", "mask"}`` plus the frozen ``bilm_params`` (and
    ``config``).  ``grads`` is returned so callers can inspect it: it has the structure of
    ``params`` (the head) and nothing else.
    """
    _parse_head(head)
    if on_the_fly and config is None:
        raise ValueError("on_the_fly=True needs config=elmo.config")

    needed = {"char_ids", "lengths", "labels", "mask"} if on_the_fly else {"layers", "labels", "mask"}

    def loss_fn(params, batch, bilm_params):
        missing = needed - set(batch)
        if missing:
            raise ValueError(f"batch lacks {', '.join(sorted(missing))}; this step takes {sorted(needed)}")
        if on_the_fly:
            if bilm_params is None:
                raise ValueError("on_the_fly=True: pass the frozen biLM as step(..., bilm_params=elmo.params)")
            layers = frozen_layers(bilm_params, config, batch["char_ids"], batch["lengths"])
        else:
            layers = batch["layers"]
        return tagger_loss(params, layers, batch["labels"], batch["mask"], head, penalty)

    @jax.jit
    def step(params, opt_state, batch, bilm_params=None):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, bilm_params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    return step


@dataclasses.dataclass
class TrainResult:
    params: dict
    losses: list[float]


def train_tagger(
    params: dict,
    layers_LNTD: np.ndarray,
    labels_NT: np.ndarray,
    mask_NT: np.ndarray,
    head: str,
    optimizer: optax.GradientTransformation | None = None,
    *,
    steps: int = 300,
    batch_size: int = 64,
    penalty: float = DEFAULT_PENALTY,
    seed: int = 0,
) -> TrainResult:
    """Minibatch training of a head on precomputed layers (sentences sampled with
    replacement, ``steps`` updates).  Returns the trained head and the loss per step."""
    optimizer = optax.adam(1e-2) if optimizer is None else optimizer
    n = np.shape(layers_LNTD)[1] if np.ndim(layers_LNTD) == 4 else None
    if n == 0:
        raise ValueError("no training sentences")
    check_tagging_data(params, layers_LNTD, labels_NT, mask_NT)
    assert n is not None  # check_tagging_data raised unless the layers are [L, N, T, D]
    jax.eval_shape(
        lambda x: tagger_logits(params, x, head),  # the head fits the layers
        jax.ShapeDtypeStruct(np.shape(layers_LNTD), jnp.float32),
    )
    step = make_train_step(head, optimizer, penalty)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(seed)
    layers = jnp.asarray(layers_LNTD)
    labels, mask = jnp.asarray(labels_NT), jnp.asarray(mask_NT)
    losses = []
    for _ in range(steps):
        idx = jnp.asarray(rng.integers(0, n, size=min(batch_size, n)))
        batch = {"layers": layers[:, idx], "labels": labels[idx], "mask": mask[idx]}
        params, opt_state, loss, _ = step(params, opt_state, batch)
        losses.append(float(loss))
    return TrainResult(params, losses)


def accuracy(
    params: dict, layers_LNTD: np.ndarray, labels_NT: np.ndarray, mask_NT: np.ndarray, head: str, batch_size: int = 256
) -> float:
    """Token accuracy over the real tokens."""
    if np.ndim(layers_LNTD) == 4 and np.shape(layers_LNTD)[1] == 0:
        raise ValueError("no sentences to score")
    check_tagging_data(params, layers_LNTD, labels_NT, mask_NT)
    fn = jax.jit(lambda p, x, m: jnp.argmax(tagger_logits(p, x, head, m), -1))
    hits = total = 0
    for s in range(0, layers_LNTD.shape[1], batch_size):
        m = np.asarray(mask_NT[s : s + batch_size], bool)
        pred = np.asarray(fn(params, jnp.asarray(layers_LNTD[:, s : s + batch_size]), jnp.asarray(m)))
        hits += int(np.sum((pred == np.asarray(labels_NT[s : s + batch_size])) & m))
        total += int(m.sum())
    return hits / max(total, 1)


def pad_layers(vectors: Sequence[np.ndarray], max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``embed(..., layers="all")`` output -> ``(layers [L+1, N, T, 2P], mask [N, T])``."""
    if not vectors:
        raise ValueError("no sentences")
    if any(np.ndim(v) != 3 for v in vectors):
        raise ValueError(
            f"pad_layers takes elmo.embed(..., layers='all') output, [L+1, n, 2P] per sentence; "
            f"got an array of shape {np.shape(next(v for v in vectors if np.ndim(v) != 3))}"
        )
    n_layers, _, width = vectors[0].shape
    t = max(max(v.shape[1] for v in vectors), 1) if max_len is None else max_len
    out = np.zeros((n_layers, len(vectors), t, width), np.float32)
    mask = np.zeros((len(vectors), t), bool)
    for i, v in enumerate(vectors):
        n = min(v.shape[1], t)
        out[:, i, :n] = v[:, :n]
        mask[i, :n] = True
    return out, mask


def pad_labels(tags: Sequence[Sequence[str]], index: Mapping[str, int], max_len: int) -> np.ndarray:
    """Tag strings -> int ``[N, T]`` (``-1`` past each sentence; unknown tags raise)."""
    out = np.full((len(tags), max_len), -1, np.int32)
    for i, sent in enumerate(tags):
        for t, tag in enumerate(sent[:max_len]):
            if tag not in index:
                raise ValueError(f"sentence {i}: tag {tag!r} is not in the class index")
            out[i, t] = index[tag]
    return out


__all__ = [
    "DEFAULT_PENALTY",
    "init_tagger",
    "tagger_logits",
    "tagger_loss",
    "frozen_layers",
    "make_train_step",
    "train_tagger",
    "accuracy",
    "pad_layers",
    "pad_labels",
    "check_tagging_data",
    "TrainResult",
]
