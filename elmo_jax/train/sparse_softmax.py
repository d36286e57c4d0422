"""The sampled-softmax training step with a sparse Adagrad update of the softmax.

A sampled softmax reads, per step, the rows of its ``S`` negatives (per direction) and of
the batch's targets; every other row of ``{'w': [V, P], 'b': [V]}`` gets a zero gradient.
For Adagrad a zero gradient changes nothing: the accumulator adds ``0`` and the update is
``0 * rsqrt(acc + eps)``.  So this step

1. gathers the touched rows once, sorted and unique (``R = 2 S + 2 B T`` slots, the unused
   ones padded with the id ``V``): duplicates share one row, so their gradients add up as
   in the dense gradient;
2. differentiates the loss with respect to those rows (and the biLM);
3. runs the same optax chain (global-norm clipping, Adagrad) on ``{biLM, rows}``, whose
   global norm is the dense gradient's (the untouched rows add zero);
4. writes the new rows and their accumulators back.

The numbers equal the dense step's up to the order of float sums (tested to 1e-6 over 50
steps); the softmax's memory and traffic fall from ``O(V P)`` to ``O(R P)`` per step.
Adam moves rows whose gradient is zero (its moments decay), so there only the dense update
is exact and this step refuses it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from elmo_jax.train.losses import sample_log_uniform, sampled_softmax_loss


def touched_rows(sample_rng: jax.Array, batch: dict, num_negatives: int, vocab_size: int,
                 axis_name: str | None = None) -> jax.Array:
    """Sorted unique ids ``[R]`` of the rows a step reads: both directions' negatives (drawn
    from ``sample_rng`` exactly as the step's loss draws them) and every target of the global
    batch; the unused slots hold ``vocab_size``."""
    k_fwd, k_bwd = jax.random.split(sample_rng)
    negatives = [sample_log_uniform(k, num_negatives, vocab_size) for k in (k_fwd, k_bwd)]
    targets = [batch["fwd_targets"], batch["bwd_targets"]]
    if axis_name is not None:  # pmap: every device must gather the same rows
        targets = [jax.lax.all_gather(t, axis_name, tiled=True) for t in targets]
    ids_R = jnp.concatenate([*negatives, *(t.reshape(-1).astype(jnp.int32) for t in targets)])
    return jnp.unique(ids_R, size=ids_R.shape[0], fill_value=vocab_size)


def rows_loss_fn(rows_R: jax.Array, num_negatives: int, vocab_size: int):
    """The sampled-softmax loss ``fn(table, h, targets, key)`` on a table of the rows
    ``rows_R`` (``{'w': [R, P], 'b': [R]}``): the same negatives and values as the dense
    loss of :func:`elmo_jax.train.losses.make_loss_fn`."""

    def fn(table, h, targets, key):
        ids_S = sample_log_uniform(key, num_negatives, vocab_size)
        return sampled_softmax_loss(
            table, h, targets, ids_S, vocab_size=vocab_size,
            target_rows=jnp.searchsorted(rows_R, targets.astype(jnp.int32)),
            sampled_rows=jnp.searchsorted(rows_R, ids_S),
        )

    return fn


def _is_rss(x) -> bool:
    return isinstance(x, optax.ScaleByRssState)


def _softmax_accumulators(opt_state, fn):
    """``opt_state`` with ``fn`` applied to the softmax part of Adagrad's accumulators."""

    def visit(s):
        if not _is_rss(s):
            return s
        sums = dict(s.sum_of_squares)
        sums["softmax"] = fn(sums["softmax"])
        return optax.ScaleByRssState(sum_of_squares=sums)

    found = [s for s in jax.tree.leaves(opt_state, is_leaf=_is_rss) if _is_rss(s)]
    if not found:
        raise ValueError("the sparse softmax update needs Adagrad's optimizer state (optax.ScaleByRssState); "
                         "use softmax_update='dense' with other optimizers")
    return jax.tree.map(visit, opt_state, is_leaf=_is_rss)


def sparse_train_step(train_state: dict, lstm_state: dict, batch: dict, sample_rng: jax.Array,
                      dropout_rng: jax.Array, *, config, optimizer: optax.GradientTransformation,
                      num_negatives: int, dropout_rate: float, dtype=jnp.float32, axis_name: str | None = None,
                      remat_steps: int = 0) -> tuple[dict, dict, dict]:
    """:func:`elmo_jax.train.step.train_step` for the sampled softmax with Adagrad, the
    softmax updated on its touched rows only (see the module docstring)."""
    from elmo_jax.train.step import _psum, lm_losses  # step imports this module lazily

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

    def objective(p):
        return lm_losses(
            p, config, batch, lstm_state, loss_fn, sample_rng=sample_rng, dropout_rng=dropout_rng,
            dropout_rate=dropout_rate, dtype=dtype, axis_name=axis_name, remat_steps=remat_steps,
        )

    (loss, (new_lstm_state, metrics)), grads = jax.value_and_grad(objective, has_aux=True)(table)
    grads = _psum(grads, axis_name)
    metrics = {k: (_psum(v, axis_name) if k.endswith("_sum") else v) for k, v in metrics.items()}
    metrics["loss"] = _psum(loss, axis_name)
    metrics["grad_norm"] = optax.global_norm(grads)
    opt_rows = _softmax_accumulators(train_state["opt_state"], lambda s: jax.tree.map(gather, s))
    updates, new_opt_rows = optimizer.update(grads, opt_rows, table)
    new_table = optax.apply_updates(table, updates)

    def put_back(old, new):
        if not _is_rss(old):
            return new
        sums = dict(new.sum_of_squares)
        sums["softmax"] = jax.tree.map(scatter, old.sum_of_squares["softmax"], new.sum_of_squares["softmax"])
        return optax.ScaleByRssState(sum_of_squares=sums)

    new_state = {
        "params": {"bilm": new_table["bilm"], "softmax": jax.tree.map(scatter, softmax, new_table["softmax"])},
        "opt_state": jax.tree.map(put_back, train_state["opt_state"], new_opt_rows, is_leaf=_is_rss),
        "step": train_state["step"] + 1,
    }
    return new_state, new_lstm_state, metrics
