"""The code a GPU or TPU runs gives the CPU's numbers (ready for accelerators).

Three choices are made by backend when tracing: the char CNN runs in chunks of sorted
tokens on the CPU only (``encoder.cnn_chunk_tokens``), the inference LSTM stops after the
last used step on the CPU only (``lstm.recurrence``: a ``while_loop`` there, the scan
elsewhere), and bf16 products accumulate in float32 inside the dot off the CPU
(``precision.product_dtype``; XLA:CPU cannot run that one, so it is not traced here).
These tests trace the first two the way an accelerator would, on the CPU, by making
``jax.default_backend()`` answer ``"gpu"``, and compare end to end with the CPU's path:
``Elmo.embed`` and the gradient of the pretraining loss.
"""

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import Elmo, ElmoConfig, batch_to_ids
from elmo_jax.model import encoder, lstm
from elmo_jax.train.losses import full_softmax_loss
from elmo_jax.train.step import init_train_state, lm_losses, make_optimizer

WORDS = "the quick brown fox jumps over a lazy dog while seven tired otters sing loudly".split()


def _sentences(n, longest, seed):
    rng = np.random.default_rng(seed)
    lengths = [longest] + list(rng.integers(1, longest + 1, n - 1))
    return [[WORDS[i] for i in rng.integers(0, len(WORDS), k)] for k in lengths]


def _traced_as(monkeypatch, backend, fn):
    """``fn()`` traced with ``jax.default_backend()`` answering ``backend`` (fresh caches)."""
    jax.clear_caches()
    with monkeypatch.context() as m:
        m.setattr(jax, "default_backend", lambda: backend)
        # Both switches see the patch: chunking and the step-skipping loop are CPU-only.
        assert encoder.cnn_chunk_tokens(10**6) == (encoder.CNN_CHUNK_TOKENS if backend == "cpu" else 0)
        assert _recurrence_loop(jnp.float32) == ("while" if backend == "cpu" else "scan")
        out = fn()
    jax.clear_caches()
    return out


def _recurrence_loop(dtype):
    """Which loop the inference recurrence traces to: ``"while"`` or ``"scan"``."""
    z = jnp.zeros
    jaxpr = str(
        jax.make_jaxpr(lambda *a: lstm.recurrence(*a, None, None, dtype))(
            z((2, 3, 8)), z((2, 2, 3)), z((4, 2, 1, 8)), z((4, 2, 1, 1)), z((2, 1, 3)), z((2, 1, 2))
        )
    )
    return "while" if " while[" in jaxpr else "scan"


def test_embed_on_the_accelerator_path_equals_the_cpu_path(monkeypatch):
    # 12 sentences of mixed lengths: groups of 8 rows hold well over 2 x 32 tokens (the CPU
    # chunks its char CNN) and are padded to their length bucket (the CPU skips those steps).
    sentences = _sentences(12, 23, seed=0)
    elmo = Elmo.random("tiny", seed=1, batch_size=8)

    def run():
        fresh = Elmo(elmo.config, elmo.params, batch_size=8)
        return fresh.embed(sentences, layers="all")

    cpu = _traced_as(monkeypatch, "cpu", run)
    accel = _traced_as(monkeypatch, "gpu", run)
    assert [a.shape for a in accel] == [c.shape for c in cpu]
    for a, c in zip(accel, cpu):
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-5 * float(np.abs(c).max()))


def test_pretraining_gradient_on_the_accelerator_path_equals_the_cpu_path(monkeypatch):
    config = ElmoConfig.preset("tiny")
    n_chars = config.char_cnn.max_characters_per_token
    vocab = 50
    state = init_train_state(jax.random.key(3), config, vocab, make_optimizer("adagrad", 0.2, 1.0, 10.0))
    # 2 directions x 3 rows x 12 steps = 72 tokens: chunked on the CPU.
    fwd = batch_to_ids(_sentences(3, 12, seed=4), n_chars)
    bwd = batch_to_ids(_sentences(3, 12, seed=5), n_chars)
    rng = np.random.default_rng(6)
    batch = {
        "fwd_char_ids": jnp.asarray(fwd),
        "bwd_char_ids": jnp.asarray(bwd),
        "fwd_targets": jnp.asarray(rng.integers(0, vocab, fwd.shape[:2])),
        "bwd_targets": jnp.asarray(rng.integers(0, vocab, bwd.shape[:2])),
        "fwd_mask": jnp.asarray(fwd.max(-1) > 0),
        "bwd_mask": jnp.asarray(bwd.max(-1) > 0),
    }
    lstm_state = lstm.zero_state(config, 3)

    def full(softmax, h, targets, key):
        return full_softmax_loss(softmax, h, targets)

    def run():
        objective = jax.jit(jax.value_and_grad(lambda p: lm_losses(p, config, batch, lstm_state, full)[0]))
        return objective(state["params"])

    (loss_cpu, grads_cpu) = _traced_as(monkeypatch, "cpu", run)
    (loss_acc, grads_acc) = _traced_as(monkeypatch, "gpu", run)
    np.testing.assert_allclose(loss_acc, loss_cpu, rtol=1e-6)
    assert jax.tree.structure(grads_acc) == jax.tree.structure(grads_cpu)
    for (path, g_cpu), g_acc in zip(jax.tree_util.tree_leaves_with_path(grads_cpu), jax.tree.leaves(grads_acc)):
        scale = float(jnp.max(jnp.abs(g_cpu))) + 1e-30
        assert float(jnp.max(jnp.abs(g_acc - g_cpu))) <= 1e-5 * scale, jax.tree_util.keystr(path)
