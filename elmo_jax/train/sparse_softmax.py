"""The pieces of the sampled-softmax training step with a sparse Adagrad update of the softmax
(the step itself is :func:`elmo_jax.train.step.sparse_train_step`).

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


def touched_rows(
    sample_rng: jax.Array, batch: dict, num_negatives: int, vocab_size: int, axis_name: str | None = None
) -> jax.Array:
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
            table,
            h,
            targets,
            ids_S,
            vocab_size=vocab_size,
            target_rows=jnp.searchsorted(rows_R, targets.astype(jnp.int32)),
            sampled_rows=jnp.searchsorted(rows_R, ids_S),
        )

    return fn


def is_rss(x) -> bool:
    return isinstance(x, optax.ScaleByRssState)


def softmax_accumulators(opt_state, fn):
    """``opt_state`` with ``fn`` applied to the softmax part of Adagrad's accumulators."""

    def visit(s):
        if not is_rss(s):
            return s
        sums = dict(s.sum_of_squares)
        sums["softmax"] = fn(sums["softmax"])
        return optax.ScaleByRssState(sum_of_squares=sums)

    found = [s for s in jax.tree.leaves(opt_state, is_leaf=is_rss) if is_rss(s)]
    if not found:
        raise ValueError(
            "the sparse softmax update needs Adagrad's optimizer state (optax.ScaleByRssState); "
            "use softmax_update='dense' with other optimizers"
        )
    return jax.tree.map(visit, opt_state, is_leaf=is_rss)
