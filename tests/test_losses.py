"""Softmax losses: exactness of the full softmax, sampled softmax's limits, the Zipf sampler."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.train import losses as L


def _params(key, vocab, dim, scale=1.0):
    p = L.init_softmax(key, vocab, dim)
    return {"w": p["w"] * scale, "b": jnp.linspace(-1.0, 1.0, vocab)}


def _reference_ce(params, h, targets):
    logits = np.asarray(h, np.float64) @ np.asarray(params["w"], np.float64).T
    logits += np.asarray(params["b"], np.float64)
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return lse - np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]


# -- parameters and the full softmax -----------------------------------------------------------


def test_init_softmax_shapes_and_scale():
    p = L.init_softmax(jax.random.PRNGKey(0), 500, 64)
    assert p["w"].shape == (500, 64) and p["b"].shape == (500,)
    assert p["w"].dtype == jnp.float32
    assert np.all(np.asarray(p["b"]) == 0)
    assert abs(float(jnp.std(p["w"])) - 1 / 8) < 0.01


@pytest.mark.fidelity
def test_full_softmax_matches_reference_and_keeps_leading_shape():
    params = _params(jax.random.PRNGKey(0), 37, 8, scale=3.0)
    h = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 8))
    t = jax.random.randint(jax.random.PRNGKey(2), (3, 5), 0, 37)
    loss = L.full_softmax_loss(params, h, t)
    assert loss.shape == (3, 5) and loss.dtype == jnp.float32
    np.testing.assert_allclose(loss, _reference_ce(params, h, t), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 10, 37, 100])
def test_chunked_full_softmax_equals_unchunked(chunk):
    params = _params(jax.random.PRNGKey(0), 37, 8, scale=3.0)
    h = jax.random.normal(jax.random.PRNGKey(1), (6, 8))
    t = jnp.arange(6) * 6
    f = lambda p, h: L.full_softmax_loss(p, h, t).sum()  # noqa: E731 - beside fc, a jitted lambda
    fc = jax.jit(lambda p, h: L.full_softmax_loss(p, h, t, chunk_size=chunk).sum())
    np.testing.assert_allclose(fc(params, h), f(params, h), rtol=1e-6)
    g, gc = jax.grad(f, argnums=(0, 1))(params, h), jax.grad(fc, argnums=(0, 1))(params, h)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(gc)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bf16_inputs_give_f32_losses():
    params = _params(jax.random.PRNGKey(0), 50, 16)
    h = jax.random.normal(jax.random.PRNGKey(1), (4, 16))
    t = jnp.array([1, 2, 3, 49])
    bf = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    ids = jnp.arange(10)
    full = L.full_softmax_loss(bf, h.astype(jnp.bfloat16), t)
    samp = L.sampled_softmax_loss(bf, h.astype(jnp.bfloat16), t, ids, vocab_size=50)
    assert full.dtype == jnp.float32 and samp.dtype == jnp.float32
    np.testing.assert_allclose(full, L.full_softmax_loss(params, h, t), rtol=3e-2, atol=3e-2)


def test_masked_mean_ignores_masked_positions_even_if_nan():
    losses = jnp.array([1.0, 3.0, jnp.nan, 5.0])
    mask = jnp.array([1, 1, 0, 0])
    assert float(L.masked_mean(losses, mask)) == 2.0
    total, count = L.masked_sum_and_count(losses, mask)
    assert float(total) == 4.0 and float(count) == 2.0
    assert float(L.masked_mean(losses, jnp.zeros(4))) == 0.0


# -- sampled softmax ---------------------------------------------------------------------------


def test_sampled_with_every_class_once_equals_full_softmax():
    # Each class sampled once, no log-Q: the negatives are all V classes; the target's own copy
    # among them is an accidental hit and is masked, which leaves exactly the full softmax.
    vocab = 37
    params = _params(jax.random.PRNGKey(0), vocab, 8, scale=3.0)
    h = jax.random.normal(jax.random.PRNGKey(1), (2, 6, 8))
    t = jax.random.randint(jax.random.PRNGKey(2), (2, 6), 0, vocab)
    ids = jax.random.permutation(jax.random.PRNGKey(3), vocab)
    sampled = L.sampled_softmax_loss(params, h, t, ids, vocab_size=vocab, subtract_log_q=False)
    full = L.full_softmax_loss(params, h, t)
    assert sampled.shape == (2, 6)
    np.testing.assert_allclose(sampled, full, atol=1e-5, rtol=1e-6)
    # ... and without hit removal the target is counted twice, so it differs.
    dup = L.sampled_softmax_loss(
        params, h, t, ids, vocab_size=vocab, subtract_log_q=False, remove_accidental_hits=False
    )
    assert np.all(np.asarray(dup) >= np.asarray(full) - 1e-6)
    assert np.any(np.asarray(dup) > np.asarray(full) + 1e-3)


def test_sampled_matches_hand_computation():
    vocab, s = 20, 5
    params = _params(jax.random.PRNGKey(0), vocab, 4, scale=2.0)
    h = jax.random.normal(jax.random.PRNGKey(1), (3, 4))
    t = jnp.array([2, 7, 0])
    ids = jnp.array([0, 7, 7, 11, 19])
    z = np.asarray(h @ params["w"].T + params["b"], np.float64)
    q = L.log_uniform_probs(vocab)
    got = L.sampled_softmax_loss(params, h, t, ids, vocab_size=vocab)
    for n in range(3):
        neg = [z[n, k] - np.log(s * q[k]) for k in np.asarray(ids) if k != int(t[n])]
        logits = np.array([z[n, int(t[n])]] + neg)
        want = -(logits[0] - np.log(np.exp(logits).sum()))
        np.testing.assert_allclose(got[n], want, rtol=1e-5)


def test_sampled_num_true_two():
    vocab = 30
    params = _params(jax.random.PRNGKey(0), vocab, 6)
    h = jax.random.normal(jax.random.PRNGKey(1), (4, 6))
    t = jnp.array([[1, 2], [3, 4], [5, 6], [7, 8]])
    ids = jnp.arange(vocab)
    loss = L.sampled_softmax_loss(params, h, t, ids, vocab_size=vocab, num_true=2, subtract_log_q=False)
    z = np.asarray(h @ params["w"].T + params["b"], np.float64)
    for n in range(4):
        a, b = np.asarray(t[n])
        others = [z[n, k] for k in range(vocab) if k not in (a, b)]
        lse = np.log(np.exp([z[n, a], z[n, b]] + others).sum())
        np.testing.assert_allclose(loss[n], lse - 0.5 * (z[n, a] + z[n, b]), rtol=1e-5)


def _grad_error(params, h, t, num_sampled, draws=20000, **kw):
    """|| E[grad_h sampled loss] - grad_h full loss || / || grad_h full loss ||."""
    vocab = params["w"].shape[0]
    full = jax.grad(lambda h: L.full_softmax_loss(params, h, t).sum())(h)

    def one(key):
        ids = L.sample_log_uniform(key, num_sampled, vocab)
        return jax.grad(lambda h: L.sampled_softmax_loss(params, h, t, ids, vocab_size=vocab, **kw).sum())(h)

    keys = jax.random.split(jax.random.PRNGKey(42), draws)
    mean = jax.jit(lambda k: jax.vmap(one)(k).mean(0))(keys)
    return float(jnp.linalg.norm(mean - full) / jnp.linalg.norm(full))


@pytest.fixture(scope="module")
def toy():
    # V = 40 Zipf-sampled classes; targets from the head (0, 3), middle (17) and tail (35).
    vocab, dim = 40, 6
    params = _params(jax.random.PRNGKey(0), vocab, dim, scale=3.0)
    t = jnp.array([0, 3, 17, 35])
    noise = jax.random.normal(jax.random.PRNGKey(1), (4, dim))
    h_unsure = noise  # every target improbable (p_t < 0.1)
    h_sure = 0.3 * noise + 1.5 * params["w"][t]  # well-predicted targets (p_t 0.7-0.99)
    return params, t, h_unsure, h_sure


@pytest.mark.parametrize("which", ["unsure", "sure"])
def test_sampled_gradient_is_consistent_with_log_q_correction(toy, which):
    # Sampled softmax is *not* unbiased for a finite number of negatives: its normaliser is a
    # ratio estimate.  What the literature relies on is that, with log Q subtracted, the
    # expected gradient converges to the full-softmax gradient as S grows, while without the
    # correction it converges to a different (proposal-weighted) target.  Check both, with
    # 20k sampled sets per estimate (Monte Carlo error ~0.3% of |grad|).
    params, t, h_unsure, h_sure = toy
    h = h_sure if which == "sure" else h_unsure
    small = _grad_error(params, h, t, 40)
    large = _grad_error(params, h, t, 640)
    uncorrected = _grad_error(params, h, t, 640, subtract_log_q=False)
    assert large < 0.03, large
    assert large < small / 5, (small, large)
    assert uncorrected > 0.1, uncorrected
    assert large < uncorrected / 5, (large, uncorrected)


@pytest.mark.slow
def test_correcting_true_logit_with_replacement_sampling_is_inconsistent(toy):
    # Why the true logit is left uncorrected by default when hits are removed: TF's formula
    # log(S Q(t)) for i.i.d. draws removes the target from the normaliser as S grows, so for
    # well-predicted frequent targets the expected gradient moves away from the true one.
    params, t, _, h_sure = toy
    tf_style = [_grad_error(params, h_sure, t, s, correct_true_logits=True) for s in (160, 640)]
    ours = _grad_error(params, h_sure, t, 640)
    assert tf_style[1] > tf_style[0] > 0.5, tf_style
    assert ours < 0.03
    # Keeping hits and correcting every logit is the other consistent combination.
    assert _grad_error(params, h_sure, t, 640, remove_accidental_hits=False) < 0.05


# -- sampler -----------------------------------------------------------------------------------


def test_log_uniform_probs_sum_to_one_and_decrease():
    for vocab in (1, 2, 10, 793471):
        p = L.log_uniform_probs(vocab)
        assert p.shape == (vocab,)
        assert abs(p.sum() - 1.0) < 1e-9
        assert np.all(np.diff(p) < 0)


@pytest.mark.parametrize("vocab", [10, 1000])
def test_sampler_frequencies_match_log_uniform(vocab):
    n = 400_000
    ids = np.asarray(jax.jit(L.sample_log_uniform, static_argnums=(1, 2))(jax.random.PRNGKey(0), n, vocab))
    assert ids.dtype == np.int32 and ids.shape == (n,)
    assert ids.min() >= 0 and ids.max() < vocab
    p = L.log_uniform_probs(vocab)
    freq = np.bincount(ids, minlength=vocab) / n
    # binomial standard error of each frequency: sqrt(p(1-p)/n) <= 0.0008 here.
    assert np.max(np.abs(freq - p)) < 0.004
    # chi-square over bins with enough expected mass.
    expected = p * n
    keep = expected >= 20
    chi2 = np.sum((freq[keep] * n - expected[keep]) ** 2 / expected[keep])
    dof = keep.sum() - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof), (chi2, dof)


def test_sampler_reaches_the_last_id():
    ids = np.asarray(L.sample_log_uniform(jax.random.PRNGKey(1), 200_000, 3))
    assert set(np.unique(ids)) == {0, 1, 2}


def test_log_expected_count_matches_probabilities():
    vocab, s = 793471, 8192
    ids = jnp.array([0, 1, 2, 100, 10_000, vocab - 1])
    got = np.asarray(L.log_expected_count(ids, s, vocab), np.float64)
    want = np.log(s * L.log_uniform_probs(vocab)[np.asarray(ids)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_expected_distinct():
    assert abs(L.expected_distinct(10, 10**6) - 10) < 2
    d = L.expected_distinct(8192, 793471)
    assert 3000 < d < 8192


# -- selection ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab, negatives", [(100, 8192), (8192, 8192), (10, 10)])
def test_make_loss_fn_picks_full_softmax_for_small_vocabularies(vocab, negatives):
    sel = L.make_loss_fn(vocab, negatives)
    assert not sel.sampled
    assert "full softmax" in sel.message
    params = _params(jax.random.PRNGKey(0), vocab, 4)
    h = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 4))
    t = jnp.zeros((2, 3), jnp.int32)
    np.testing.assert_allclose(jax.jit(sel.fn)(params, h, t, jax.random.PRNGKey(0)), L.full_softmax_loss(params, h, t))


def test_make_loss_fn_picks_sampled_softmax_for_large_vocabularies():
    sel = L.make_loss_fn(1000, 64)
    assert sel.sampled and "sampled softmax" in sel.message
    params = _params(jax.random.PRNGKey(0), 1000, 4)
    h = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 4))
    t = jnp.ones((2, 3), jnp.int32)
    fn = jax.jit(sel.fn)
    a = fn(params, h, t, jax.random.PRNGKey(0))
    b = fn(params, h, t, jax.random.PRNGKey(1))
    assert a.shape == (2, 3) and np.all(np.isfinite(a))
    assert not np.allclose(a, b)  # fresh negatives per key


def test_make_loss_fn_rejects_bad_sizes():
    with pytest.raises(ValueError):
        L.make_loss_fn(0, 10)
    with pytest.raises(ValueError):
        L.make_loss_fn(10, 0)
