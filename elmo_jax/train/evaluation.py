"""Held-out perplexity of a biLM's parameters: the full softmax, no dropout, LSTM state carried."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from elmo_jax.config import ElmoConfig
from elmo_jax.data.batches import LMBatcher
from elmo_jax.data.vocab import Vocabulary
from elmo_jax.model.lstm import zero_state
from elmo_jax.train.losses import perplexity
from elmo_jax.train.parallel import make_eval_fn


def evaluate(
    params: dict,
    config: ElmoConfig,
    source,
    vocab: Vocabulary,
    *,
    batch_size: int = 32,
    unroll_steps: int = 20,
    dtype=jnp.float32,
    max_batches: int | None = None,
    eval_fn=None,
    should_stop: Callable[[], bool] | None = None,
) -> dict | None:
    """Held-out perplexity with the full softmax, no dropout, LSTM state carried.

    With one row (``batch_size=1``) the window length is irrelevant, so this equals the
    original's evaluation with unroll 1.  With several rows it is not quite: rows take
    their next sentence at window edges, so ``unroll_steps`` changes which sentences follow
    each other in a row and so the state carried into each sentence (measured on a tiny
    model: perplexity 261.1 at 4 rows x 20, 264.8 at 4 x 7, 263.1 with one row).

    Reported as the original does: ``exp`` of the mean over positions of
    ``0.5 * (loss_fwd + loss_bwd)``, plus each direction's own perplexity.  Returns None
    if ``should_stop()`` becomes true (it is asked between batches).

    Positions counted: each sentence's words and its end (``n + 1`` per sentence, the
    standard definition).  The streams also hold the marker that *starts* the next
    sentence (``<S>`` after ``</S>`` forward, ``</S>`` after ``<S>`` backward), which is
    certain given the previous token; the original counted it, which lowers the reported
    perplexity by a factor of about ``ppl ** (1 / (n + 2))``.  It is left out here.
    """
    if batch_size < 1 or (max_batches is not None and max_batches < 1):
        raise ValueError(f"batch_size and max_batches must be >= 1, got {batch_size} and {max_batches}")
    eval_fn = eval_fn or make_eval_fn(config, dtype)
    batcher = LMBatcher(
        source, vocab, batch_size, unroll_steps, config.char_cnn.max_characters_per_token, shuffle=False, num_epochs=1
    )
    state = zero_state(config, batch_size)
    totals = np.zeros(4)
    for n, batch in enumerate(batcher):
        if max_batches is not None and n >= max_batches:
            break
        if should_stop is not None and should_stop():  # checked between batches
            return None
        batch = dict(batch)
        batch["fwd_mask"] = batch["fwd_mask"] * (batch["fwd_targets"] != vocab.bos_id)
        batch["bwd_mask"] = batch["bwd_mask"] * (batch["bwd_targets"] != vocab.eos_id)
        state, m = eval_fn(params, state, batch)
        totals += [float(m["fwd_loss_sum"]), float(m["fwd_count"]), float(m["bwd_loss_sum"]), float(m["bwd_count"])]
    if not totals[1] or not totals[3]:
        raise ValueError(
            "the held-out data gave no positions to score (no sentences?): a perplexity "
            "needs at least one held-out sentence"
        )
    fwd = totals[0] / totals[1]
    bwd = totals[2] / totals[3]
    return {
        "perplexity": perplexity(0.5 * (fwd + bwd)),
        "fwd_perplexity": perplexity(fwd),
        "bwd_perplexity": perplexity(bwd),
        "tokens": int(totals[1]),
    }
