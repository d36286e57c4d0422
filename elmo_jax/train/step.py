"""The pure pretraining step: the two LM losses, their gradient, one optimizer update.

Everything here is a function of explicit pytrees; parallelism (``pmap`` over devices, the
``jit`` + mesh form) wraps these functions without changing them.  Inside a parallel map
the functions reduce over ``axis_name`` so the loss and the gradient are those of the
*global* batch: per-position losses are summed, token counts are summed over devices, and
the mean is taken once.  Run without ``axis_name`` on one device, the same code gives the
same numbers for the same global batch.

Train state (a plain dict pytree)::

    params    {"bilm": encoder + LSTM params, "softmax": {"w": [V, P], "b": [V]}}
    opt_state optax state of the optimizer
    step      int32 scalar

LSTM state (carried across windows, gradients stopped at the window edge):
``{"h": [L, 2, B, P], "c": [L, 2, B, H]}``, direction 0 forward, 1 backward.
"""

from __future__ import annotations

from typing import Callable

import functools

import jax
import jax.numpy as jnp
import optax

from elmo_jax.config import ElmoConfig
from elmo_jax.model.bilm import init_params
from elmo_jax.model.chunks import from_chunks, to_chunks
from elmo_jax.model.encoder import GRAD_TRIM_LEVELS, encode_tokens, encode_tokens_remat
from elmo_jax.model.lstm import dropout, lstm_stack
from elmo_jax.train.config_loader import OPTIMIZERS
from elmo_jax.train.losses import full_softmax_loss, init_softmax, masked_sum_and_count
from elmo_jax.train.sparse_softmax import is_rss, rows_loss_fn, softmax_accumulators, touched_rows

LossFn = Callable[..., jax.Array]


def make_optimizer(
    name: str, learning_rate: float, initial_accumulator: float, clip_norm: float
) -> optax.GradientTransformation:
    """Global-norm clipping, then Adagrad (the original recipe, no schedule) or Adam."""
    if name == "adagrad":
        update = optax.adagrad(learning_rate, initial_accumulator_value=initial_accumulator, eps=1e-7)
    elif name == "adam":
        update = optax.adam(learning_rate)
    else:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    return optax.chain(optax.clip_by_global_norm(clip_norm), update)


def init_train_state(key: jax.Array, config: ElmoConfig, vocab_size: int, optimizer) -> dict:
    """Fresh params (biLM + softmax shared by both directions) and optimizer state."""
    k_bilm, k_softmax = jax.random.split(key)
    params = {
        "bilm": init_params(k_bilm, config),
        "softmax": init_softmax(k_softmax, vocab_size, config.projection_dim),
    }
    return {"params": params, "opt_state": optimizer.init(params), "step": jnp.zeros((), jnp.int32)}


def _psum(x, axis_name):
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def _position_losses(
    loss_fn: LossFn, softmax: dict, h_BTP: jax.Array, targets_BT: jax.Array, key: jax.Array, remat_steps: int
) -> jax.Array:
    """``loss_fn`` per position ``[B, T]``; with ``0 < remat_steps < T`` in chunks of that many
    steps, each recomputed in the backward pass, so that the ``[B * T, negatives]`` logits
    exist for one chunk at a time.  Every chunk gets the same key, hence the same negatives:
    the values equal the unchunked call's."""
    T = h_BTP.shape[1]
    if not 0 < remat_steps < T:
        return loss_fn(softmax, h_BTP, targets_BT, key)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk(xs):
        return loss_fn(softmax, xs[0], xs[1], key)

    l_NBK = jax.lax.map(chunk, (to_chunks(h_BTP, 1, remat_steps), to_chunks(targets_BT, 1, remat_steps)))
    return from_chunks(l_NBK, 1, T)


def lm_losses(
    params: dict,
    config: ElmoConfig,
    batch: dict,
    lstm_state: dict,
    loss_fn: LossFn,
    *,
    sample_rng: jax.Array | None = None,
    dropout_rng: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dtype=jnp.float32,
    axis_name: str | None = None,
    remat_steps: int = 0,
) -> tuple[jax.Array, tuple[dict, dict]]:
    """The objective ``0.5 * (forward + backward)`` mean cross-entropy over the global batch.

    ``batch``: ``{fwd,bwd}_char_ids [B, T, C]``, ``{fwd,bwd}_targets [B, T]``,
    ``{fwd,bwd}_mask [B, T]``.  ``loss_fn(softmax, h, targets, key)`` gives per-position
    losses (sampled or full softmax); it gets keys from ``sample_rng`` (the same on every
    device, so one set of negatives serves the global batch); ``dropout_rng`` should
    differ per device.  ``remat_steps``: recompute the char CNN, the LSTM and the softmax
    activations in chunks of that many steps in the backward pass (see
    :func:`elmo_jax.model.encoder.encode_tokens_remat`, :func:`elmo_jax.model.lstm.lstm_layer`
    and :func:`_position_losses`): the same values, with training memory nearly flat in the
    window length.  Returns the loss, the new LSTM state (gradient
    stopped) and per-direction sums and counts for metrics.
    """
    ids_RBTC = jnp.stack([batch["fwd_char_ids"], batch["bwd_char_ids"]])
    targets_RBT = jnp.stack([batch["fwd_targets"], batch["bwd_targets"]])
    mask_RBT = jnp.stack([batch["fwd_mask"], batch["bwd_mask"]]).astype(jnp.float32)
    real_RBT = jnp.any(ids_RBTC > 0, axis=-1)
    if 0 < remat_steps < ids_RBTC.shape[2]:
        x_RBTP = encode_tokens_remat(params["bilm"], config, ids_RBTC, remat_steps, dtype=dtype)
    else:
        x_RBTP = encode_tokens(params["bilm"], config, ids_RBTC, dtype=dtype, trim_levels=GRAD_TRIM_LEVELS)
    if dropout_rate > 0.0 and dropout_rng is None:
        raise ValueError("dropout_rate > 0 needs a dropout_rng")
    k_lstm: jax.Array | None = None
    k_top: jax.Array | None = None
    if dropout_rate > 0.0:
        assert dropout_rng is not None  # checked just above
        k_lstm, k_top = jax.random.split(dropout_rng)
    k_fwd, k_bwd = jax.random.split(sample_rng if sample_rng is not None else jax.random.key(0))
    outputs, new_state = lstm_stack(
        params["bilm"]["lstm"],
        config,
        x_RBTP,
        real_RBT,
        lstm_state,
        dropout_rate=dropout_rate,
        rng=k_lstm,
        dtype=dtype,
        remat_steps=remat_steps,
    )
    top_RBTP = outputs[-1]
    if dropout_rate > 0.0:
        assert k_top is not None  # split from dropout_rng above
        top_RBTP = dropout(k_top, top_RBTP, dropout_rate)
    # Negatives are drawn per direction but shared by every position (and device) of the batch.
    losses = [
        _position_losses(loss_fn, params["softmax"], top_RBTP[r], targets_RBT[r], k, remat_steps)
        for r, k in enumerate((k_fwd, k_bwd))
    ]
    sums = [masked_sum_and_count(l, mask_RBT[r])[0] for r, l in enumerate(losses)]
    counts = [jax.lax.stop_gradient(_psum(jnp.sum(mask_RBT[r]), axis_name)) for r in range(2)]
    loss = 0.5 * sum(s / jnp.maximum(c, 1.0) for s, c in zip(sums, counts))
    metrics = {
        "fwd_loss_sum": jax.lax.stop_gradient(sums[0]),
        "bwd_loss_sum": jax.lax.stop_gradient(sums[1]),
        "fwd_count": counts[0],
        "bwd_count": counts[1],
    }
    return loss, (jax.lax.stop_gradient(new_state), metrics)


def _gradients(
    params: dict,
    config: ElmoConfig,
    batch: dict,
    lstm_state: dict,
    loss_fn: LossFn,
    sample_rng: jax.Array,
    dropout_rng: jax.Array,
    dropout_rate: float,
    dtype,
    axis_name: str | None,
    remat_steps: int,
) -> tuple[dict, dict, dict]:
    """The loss's gradient with respect to ``params`` (the whole model, or the biLM and the
    softmax rows a sparse step touches), summed over devices, with the new LSTM state and the
    global batch's metrics (sums, ``loss``, ``grad_norm``)."""

    def objective(p):
        return lm_losses(
            p,
            config,
            batch,
            lstm_state,
            loss_fn,
            sample_rng=sample_rng,
            dropout_rng=dropout_rng,
            dropout_rate=dropout_rate,
            dtype=dtype,
            axis_name=axis_name,
            remat_steps=remat_steps,
        )

    (loss, (new_lstm_state, metrics)), grads = jax.value_and_grad(objective, has_aux=True)(params)
    grads = _psum(grads, axis_name)
    metrics = {k: (_psum(v, axis_name) if k.endswith("_sum") else v) for k, v in metrics.items()}
    metrics["loss"] = _psum(loss, axis_name)
    metrics["grad_norm"] = optax.global_norm(grads)
    return grads, new_lstm_state, metrics


def train_step(
    train_state: dict,
    lstm_state: dict,
    batch: dict,
    sample_rng: jax.Array,
    dropout_rng: jax.Array,
    *,
    config: ElmoConfig,
    optimizer: optax.GradientTransformation,
    loss_fn: LossFn,
    dropout_rate: float,
    dtype=jnp.float32,
    axis_name: str | None = None,
    remat_steps: int = 0,
    sparse_negatives: int = 0,
) -> tuple[dict, dict, dict]:
    """One update -> (new train state, new LSTM state, metrics of the global batch).

    ``sparse_negatives > 0``: the sampled softmax with that many negatives, the softmax
    updated on its touched rows only (Adagrad; ``loss_fn`` is then not used), see
    :mod:`elmo_jax.train.sparse_softmax`."""
    if sparse_negatives > 0:
        return sparse_train_step(
            train_state,
            lstm_state,
            batch,
            sample_rng,
            dropout_rng,
            config=config,
            optimizer=optimizer,
            num_negatives=sparse_negatives,
            dropout_rate=dropout_rate,
            dtype=dtype,
            axis_name=axis_name,
            remat_steps=remat_steps,
        )
    params = train_state["params"]
    grads, new_lstm_state, metrics = _gradients(
        params, config, batch, lstm_state, loss_fn, sample_rng, dropout_rng, dropout_rate, dtype, axis_name, remat_steps
    )
    updates, opt_state = optimizer.update(grads, train_state["opt_state"], params)
    new_state = {
        "params": optax.apply_updates(params, updates),
        "opt_state": opt_state,
        "step": train_state["step"] + 1,
    }
    return new_state, new_lstm_state, metrics


def sparse_train_step(
    train_state: dict,
    lstm_state: dict,
    batch: dict,
    sample_rng: jax.Array,
    dropout_rng: jax.Array,
    *,
    config,
    optimizer: optax.GradientTransformation,
    num_negatives: int,
    dropout_rate: float,
    dtype=jnp.float32,
    axis_name: str | None = None,
    remat_steps: int = 0,
) -> tuple[dict, dict, dict]:
    """:func:`train_step` for the sampled softmax with Adagrad, the softmax updated on its
    touched rows only (see :mod:`elmo_jax.train.sparse_softmax`)."""
    params = train_state["params"]
    softmax = params["softmax"]
    vocab_size = softmax["w"].shape[0]
    rows_R = touched_rows(sample_rng, batch, num_negatives, vocab_size, axis_name)

    def gather(x):  # padding slots (id V) read row V-1, get no gradient and are never written
        return jnp.take(x, rows_R, axis=0, mode="clip")

    def scatter(full, part):
        return full.at[rows_R].set(part, mode="drop")

    table = {"bilm": params["bilm"], "softmax": jax.tree.map(gather, softmax)}
    loss_fn = rows_loss_fn(rows_R, num_negatives, vocab_size)

    grads, new_lstm_state, metrics = _gradients(
        table, config, batch, lstm_state, loss_fn, sample_rng, dropout_rng, dropout_rate, dtype, axis_name, remat_steps
    )
    opt_rows = softmax_accumulators(train_state["opt_state"], lambda s: jax.tree.map(gather, s))
    updates, new_opt_rows = optimizer.update(grads, opt_rows, table)
    new_table = optax.apply_updates(table, updates)

    def put_back(old, new):
        if not is_rss(old):
            return new
        sums = dict(new.sum_of_squares)
        sums["softmax"] = jax.tree.map(scatter, old.sum_of_squares["softmax"], new.sum_of_squares["softmax"])
        return optax.ScaleByRssState(sum_of_squares=sums)

    new_state = {
        "params": {"bilm": new_table["bilm"], "softmax": jax.tree.map(scatter, softmax, new_table["softmax"])},
        "opt_state": jax.tree.map(put_back, train_state["opt_state"], new_opt_rows, is_leaf=is_rss),
        "step": train_state["step"] + 1,
    }
    return new_state, new_lstm_state, metrics


def eval_step(
    params: dict,
    lstm_state: dict,
    batch: dict,
    *,
    config: ElmoConfig,
    dtype=jnp.float32,
    chunk_size: int | None = None,
    axis_name: str | None = None,
) -> tuple[dict, dict]:
    """Full-softmax loss sums and counts per direction, no dropout, state carried."""

    def full(softmax, h, targets, key):
        return full_softmax_loss(softmax, h, targets, chunk_size=chunk_size)

    _, (new_state, metrics) = lm_losses(params, config, batch, lstm_state, full, dtype=dtype, axis_name=axis_name)
    metrics = {k: (_psum(v, axis_name) if k.endswith("_sum") else v) for k, v in metrics.items()}
    return new_state, metrics
