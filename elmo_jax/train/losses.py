"""Softmax losses for the forward and backward language-model objectives.

One softmax, ``{'w': [V, P], 'b': [V]}``, is shared by both directions (ELMo §3).  Every loss
here returns a *per-position* cross-entropy (natural log, float32) with the leading shape of the
targets, so the caller decides how to mask, sum and average (across devices, directions, ...).
``h`` may have any leading shape ``[..., P]`` matching ``targets`` ``[...]``; it may be bf16 —
logits are always accumulated and normalised in float32.

Two objectives:

* :func:`full_softmax_loss` — exact cross-entropy over the whole vocabulary (evaluation, small
  vocabularies), optionally computed in vocabulary chunks to bound memory for big vocabularies.
* :func:`sampled_softmax_loss` — the training objective of the original model: ``S`` negatives
  drawn from a log-uniform (Zipf) proposal over the frequency-sorted vocabulary, one set shared
  by all positions of the batch, log Q subtracted, accidental hits removed.

Sampler: with replacement (a departure from the original)
----------------------------------------------------------
The original called TensorFlow's ``tf.nn.sampled_softmax_loss`` whose default log-uniform
sampler draws *unique* candidates: it keeps drawing until it has ``S`` distinct ids and reports
the expected count of class ``k`` as ``1 - (1 - P(k)) ** num_tries``.  Under ``jit`` that is
a data-dependent loop, so :func:`sample_log_uniform` draws ``S`` ids *with replacement* (one
vectorised inverse-CDF step) and :func:`log_expected_count` uses the matching expected count
``S * P(k)``.  Consequences:

* the set may contain duplicates; each copy contributes its own logit, which is exactly what the
  expected count ``S * P(k)`` accounts for (the standard importance-sampling estimator of the
  partition function), so the log-Q correction remains consistent;
* with a Zipf proposal the head words are drawn many times, so a set of ``S`` draws contains
  fewer *distinct* negatives than TF's ``S`` unique ones (for the 793k lm1b vocabulary and
  ``S = 8192`` about 4.9k distinct ids per draw, see :func:`expected_distinct`).  The cost of a
  step is the same, the estimate of the partition function is somewhat noisier;
* ``num_tries`` never exceeds ``S``, so nothing like TF's retry loop runs.

The sampled loss is *not* a perplexity: it is biased low and only meant for gradients.  Its
expected gradient approaches the full-softmax gradient as ``S`` grows (it is consistent, not
unbiased for finite ``S``); without the log-Q correction it converges to the wrong target.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "LossSelection",
    "expected_distinct",
    "full_softmax_loss",
    "init_softmax",
    "log_expected_count",
    "log_uniform_probs",
    "make_loss_fn",
    "masked_mean",
    "masked_sum_and_count",
    "sample_log_uniform",
    "sampled_softmax_loss",
]

log = logging.getLogger(__name__)

# Logit given to accidental hits (and to padding rows of a chunked softmax).  Finite, so that
# exp/logsumexp and their gradients never produce NaN; far below any real logit in f32.
_MASKED_LOGIT = -1e9


# -- parameters ------------------------------------------------------------------------------


def init_softmax(key: jax.Array, vocab_size: int, dim: int, dtype=jnp.float32) -> dict:
    """Softmax parameters ``{'w': [V, P], 'b': [V]}``.

    ``w ~ N(0, 1/P)`` (the original's ``random_normal_initializer(0, 1/sqrt(P))``), ``b = 0``.
    """
    if vocab_size < 1 or dim < 1:
        raise ValueError(f"vocab_size and dim must be positive, got {vocab_size}, {dim}")
    w = jax.random.normal(key, (vocab_size, dim), jnp.float32) / math.sqrt(dim)
    return {"w": w.astype(dtype), "b": jnp.zeros((vocab_size,), dtype)}


# -- helpers ---------------------------------------------------------------------------------


def _flatten(h: jax.Array, targets: jax.Array, num_true: int = 1):
    """``h [..., P]`` -> ``[N, P]``; targets ``[...]`` (or ``[..., num_true]``) -> ``[N, T]``."""
    lead = targets.shape if num_true == 1 else targets.shape[:-1]
    if num_true != 1 and targets.shape[-1] != num_true:
        raise ValueError(f"targets last axis {targets.shape[-1]} != num_true {num_true}")
    if h.shape[:-1] != lead:
        raise ValueError(f"h {h.shape} and targets {targets.shape} disagree on leading shape")
    n = math.prod(lead)
    return h.reshape(n, h.shape[-1]), targets.reshape(n, num_true).astype(jnp.int32), lead


def _logits(h: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """``h @ w.T + b`` in float32 (bf16 inputs are multiplied with f32 accumulation)."""
    dtype = jnp.promote_types(h.dtype, w.dtype)
    z = jnp.einsum("np,vp->nv", h.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)
    return z + b.astype(jnp.float32)


def _true_logits(h: jax.Array, w: jax.Array, b: jax.Array, ids: jax.Array) -> jax.Array:
    """Logits of ``ids [N, T]`` for each row of ``h [N, P]``: ``[N, T]`` float32."""
    dtype = jnp.promote_types(h.dtype, w.dtype)
    wt = w[ids].astype(dtype)  # [N, T, P]
    z = jnp.einsum("np,ntp->nt", h.astype(dtype), wt, preferred_element_type=jnp.float32)
    return z + b[ids].astype(jnp.float32)


def masked_sum_and_count(losses: jax.Array, mask: jax.Array | None = None):
    """``(sum of losses where mask, number of such positions)`` — both float32 scalars.

    Sum and count (rather than a mean) so that callers can ``psum`` both across devices.
    """
    losses = losses.astype(jnp.float32)
    if mask is None:
        return jnp.sum(losses), jnp.asarray(losses.size, jnp.float32)
    m = mask.astype(jnp.float32)
    # where, not multiply: a masked-out inf/NaN must not leak into the sum.
    return jnp.sum(jnp.where(m > 0, losses * m, 0.0)), jnp.sum(m)


def masked_mean(losses: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean of ``losses`` over the positions where ``mask``; 0 if there are none."""
    total, count = masked_sum_and_count(losses, mask)
    return total / jnp.maximum(count, 1.0)


# -- full softmax ----------------------------------------------------------------------------


def full_softmax_loss(
    softmax_params: dict,
    h: jax.Array,
    targets: jax.Array,
    *,
    chunk_size: int | None = None,
) -> jax.Array:
    """Exact cross-entropy ``logsumexp(h @ w.T + b) - logit[target]`` per position (float32).

    ``h [..., P]``, ``targets [...]`` -> ``[...]``.  With ``chunk_size`` the log-partition is
    accumulated over vocabulary chunks of that many rows (a ``lax.scan`` whose body is
    rematerialised), so no ``[N, V]`` array is ever held — for evaluating a 793k vocabulary.
    """
    w, b = softmax_params["w"], softmax_params["b"]
    hf, t, lead = _flatten(h, targets)
    true_logit = _true_logits(hf, w, b, t)[:, 0]
    vocab = w.shape[0]
    if chunk_size is None or chunk_size >= vocab:
        lse = jax.nn.logsumexp(_logits(hf, w, b), axis=-1)
    else:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        n_chunks = -(-vocab // chunk_size)
        pad = n_chunks * chunk_size - vocab
        wc = jnp.pad(w, ((0, pad), (0, 0))).reshape(n_chunks, chunk_size, w.shape[1])
        bc = jnp.pad(b.astype(jnp.float32), (0, pad), constant_values=_MASKED_LOGIT)
        bc = bc.reshape(n_chunks, chunk_size)

        @jax.checkpoint
        def chunk_lse(wb):
            return jax.nn.logsumexp(_logits(hf, wb[0], wb[1]), axis=-1)

        _, lses = jax.lax.scan(lambda c, wb: (c, chunk_lse(wb)), None, (wc, bc))
        lse = jax.nn.logsumexp(lses, axis=0)
    return (lse - true_logit).reshape(lead)


# -- log-uniform sampler ---------------------------------------------------------------------


def log_uniform_probs(vocab_size: int) -> np.ndarray:
    """``P(k) = (log(k+2) - log(k+1)) / log(V+1)`` for ``k < V`` (float64 numpy; sums to 1)."""
    k = np.arange(vocab_size, dtype=np.float64)
    return np.log1p(1.0 / (k + 1.0)) / np.log(vocab_size + 1.0)


def sample_log_uniform(key: jax.Array, num_sampled: int, vocab_size: int) -> jax.Array:
    """``num_sampled`` ids drawn i.i.d. (with replacement) from the log-uniform distribution.

    Inverse CDF: the CDF is ``log(k+2)/log(V+1)``, so ``k = floor(exp(u log(V+1))) - 1`` for
    ``u ~ U[0, 1)``, clipped to ``[0, V)``.  Returns int32 ``[num_sampled]``.  (float32 ``u``
    resolves ``2**-23``; the resulting error only concerns ids near ``V`` whose probability is
    ~1e-7 each — TF uses a double here.)
    """
    u = jax.random.uniform(key, (num_sampled,), jnp.float32)
    k = jnp.floor(jnp.exp(u * jnp.float32(math.log(vocab_size + 1.0)))) - 1.0
    return jnp.clip(k, 0, vocab_size - 1).astype(jnp.int32)


def log_expected_count(ids: jax.Array, num_sampled: int, vocab_size: int) -> jax.Array:
    """``log(num_sampled * P(ids))``: log of how often each id is expected among the draws.

    Matches :func:`sample_log_uniform` (with replacement).  float32, same shape as ``ids``.
    """
    k = ids.astype(jnp.float32)
    log_p = jnp.log(jnp.log1p(1.0 / (k + 1.0))) - jnp.float32(math.log(math.log(vocab_size + 1.0)))
    return log_p + jnp.float32(math.log(num_sampled))


def expected_distinct(num_sampled: int, vocab_size: int) -> float:
    """Expected number of distinct ids among ``num_sampled`` log-uniform draws (numpy)."""
    p = log_uniform_probs(vocab_size)
    return float(np.sum(-np.expm1(num_sampled * np.log1p(-p))))


# -- sampled softmax -------------------------------------------------------------------------


def sampled_softmax_loss(
    softmax_params: dict,
    h: jax.Array,
    targets: jax.Array,
    sampled_ids: jax.Array,
    *,
    vocab_size: int,
    num_true: int = 1,
    remove_accidental_hits: bool = True,
    subtract_log_q: bool = True,
    correct_true_logits: bool | None = None,
    target_rows: jax.Array | None = None,
    sampled_rows: jax.Array | None = None,
) -> jax.Array:
    """Sampled-softmax cross-entropy per position (float32), as ``tf.nn.sampled_softmax_loss``.

    ``h [..., P]``; ``targets [...]`` (or ``[..., num_true]``); ``sampled_ids [S]`` negatives
    shared by every position (e.g. from :func:`sample_log_uniform`).  For each position the
    logits are ``[true logit(s), S sampled logits]``; with ``subtract_log_q`` each sampled
    logit has ``log_expected_count`` of its id subtracted; with ``remove_accidental_hits`` a
    sampled id equal to one of the position's targets gets a logit of -1e9 (and no gradient).
    The label puts ``1/num_true`` on each true logit.  ``vocab_size`` is the sampler's range
    (needed for log Q).  Returns ``[...]``.

    ``correct_true_logits`` — whether the *true* logits get log Q subtracted as well (only
    with ``subtract_log_q``).  TF always does so; ``None`` (the default) does so only when
    accidental hits are kept.  Reason: with i.i.d. draws and hits removed, the normaliser this
    loss uses is ``exp(z_t) + (1/S) sum_j [s_j != t] exp(z_sj) / Q(s_j)``, an unbiased
    estimate of the partition function only if ``z_t`` is *not* corrected.  Subtracting
    ``log(S Q(t))`` from it (TF's formula for a sampler with replacement) makes the true class
    vanish from the normaliser as ``S`` grows, and the expected gradient then drifts *away*
    from the full-softmax gradient for well-predicted frequent targets (see
    ``tests/test_losses.py``).  TF's *unique* sampler, which the original used, does not have
    this problem because its expected count for a frequent target tends to 1 (log Q -> 0).
    With hits kept, correcting both is the consistent estimator (the true class is counted
    through its sampled copies).
    ``target_rows`` (the shape of ``targets``) and ``sampled_rows [S]``: where the rows of the
    targets and of the negatives are in ``softmax_params`` when that holds only some rows of
    the vocabulary (a sparse update gathers the touched rows first); None: row = id.
    """
    w, b = softmax_params["w"], softmax_params["b"]
    hf, t, lead = _flatten(h, targets, num_true)
    sampled_ids = sampled_ids.astype(jnp.int32)
    num_sampled = sampled_ids.shape[0]

    t_rows = t if target_rows is None else target_rows.reshape(t.shape).astype(jnp.int32)
    s_rows = sampled_ids if sampled_rows is None else sampled_rows.astype(jnp.int32)
    true_logits = _true_logits(hf, w, b, t_rows)  # [N, T]
    sampled_logits = _logits(hf, w[s_rows], b[s_rows])  # [N, S]
    if correct_true_logits is None:
        correct_true_logits = not remove_accidental_hits
    if subtract_log_q:
        if correct_true_logits:
            true_logits = true_logits - log_expected_count(t, num_sampled, vocab_size)
        sampled_logits = sampled_logits - log_expected_count(sampled_ids, num_sampled, vocab_size)
    if remove_accidental_hits:
        hits = jnp.any(t[:, :, None] == sampled_ids[None, None, :], axis=1)  # [N, S]
        sampled_logits = jnp.where(hits, _MASKED_LOGIT, sampled_logits)

    logits = jnp.concatenate([true_logits, sampled_logits], axis=-1)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    loss = -jnp.mean(log_probs[:, :num_true], axis=-1)
    return loss.reshape(lead)


# -- selection -------------------------------------------------------------------------------


class LossSelection(NamedTuple):
    """What :func:`make_loss_fn` picked.

    ``fn(softmax_params, h, targets, key) -> per-position loss`` (``key`` is ignored by the
    full softmax); ``sampled`` says which objective it is; ``message`` is a line for the log.
    """

    fn: Callable[..., jax.Array]
    sampled: bool
    message: str


def make_loss_fn(
    vocab_size: int,
    num_negatives: int,
    *,
    chunk_size: int | None = None,
) -> LossSelection:
    """The training objective for a vocabulary of ``vocab_size`` and ``num_negatives`` samples.

    Full softmax when ``vocab_size <= num_negatives`` (sampling would cost as much as the exact
    loss and only add noise), otherwise the sampled softmax of the original recipe with a fresh
    set of ``num_negatives`` log-uniform negatives drawn from ``key`` on each call — call it
    with different keys for the forward and backward directions, as the original did.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if num_negatives < 1:
        raise ValueError(f"num_negatives must be positive, got {num_negatives}")

    if vocab_size <= num_negatives:
        message = (
            f"vocabulary of {vocab_size} <= num_negatives {num_negatives}: "
            f"training with the full softmax instead of sampled softmax"
        )

        def full_fn(softmax_params, h, targets, key=None):
            del key
            return full_softmax_loss(softmax_params, h, targets, chunk_size=chunk_size)

        log.info(message)
        return LossSelection(full_fn, False, message)

    message = (
        f"sampled softmax: {num_negatives} log-uniform negatives (with replacement, "
        f"~{expected_distinct(num_negatives, vocab_size):.0f} distinct) shared per batch "
        f"over a vocabulary of {vocab_size}"
    )

    def fn(softmax_params, h, targets, key):
        ids = sample_log_uniform(key, num_negatives, vocab_size)
        return sampled_softmax_loss(softmax_params, h, targets, ids, vocab_size=vocab_size)

    log.info(message)
    return LossSelection(fn, True, message)


def perplexity(mean_loss: float) -> float:
    """``exp(mean_loss)`` on the host, ``inf`` where that overflows a float (a loss above
    ~709.8): a diverged run's perplexity is a value to report, not an exception."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf


def divergence_limit(vocab_size: int) -> float:
    """The training loss above which a run counts as diverged although still finite.

    A fresh model predicts about uniformly, a loss of ``log V``, and training only lowers
    it; a loss above ``3 log V + 10`` (e.g. 13.8 -> 51 for lm1b's vocabulary, 32 for a
    vocabulary of 1000) means the softmax assigns the targets far less than uniform
    probability, which happens when the parameters blow up, not during learning.
    """
    return 3.0 * math.log(max(vocab_size, 2)) + 10.0
