"""The sparse softmax update (Adagrad on the touched rows) equals the dense step."""

import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from elmo_jax.config import ElmoConfig
from elmo_jax.data.batches import LMBatcher
from elmo_jax.data.text_source import InMemorySource
from elmo_jax.data.vocab import Vocabulary
from elmo_jax.model.lstm import zero_state
from elmo_jax.train.config_loader import ConfigError, TrainConfig
from elmo_jax.train.losses import make_loss_fn
from elmo_jax.train.sparse_softmax import touched_rows
from elmo_jax.train.step import init_train_state, make_optimizer, train_step
from tests.conftest import device_env


def _setup(rows=4, unroll=5):
    cfg = ElmoConfig.preset("tiny").replace(dim=16, projection_dim=8, filters=((1, 8), (2, 8)))
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    sents = [list(rng.choice(words, size=rng.integers(1, 12))) for _ in range(400)]
    vocab = Vocabulary.build(sents)
    batches = [b for _, b in zip(range(50), LMBatcher(InMemorySource(sents), vocab, rows, unroll, 50, seed=1))]
    return cfg, vocab, batches


@pytest.mark.parametrize("remat_steps", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_sparse_adagrad_equals_dense_over_50_steps(remat_steps):
    cfg, vocab, batches = _setup()
    negatives = 24  # far fewer than the ~300 words: most rows untouched per step, duplicates drawn
    loss = make_loss_fn(len(vocab), negatives)
    assert loss.sampled
    opt = make_optimizer("adagrad", 0.2, 1.0, 1.0)  # a low clip norm: clipping is exercised
    kwargs = dict(config=cfg, optimizer=opt, loss_fn=loss.fn, dropout_rate=0.1, remat_steps=remat_steps)
    dense = jax.jit(lambda *a: train_step(*a, **kwargs))
    sparse = jax.jit(lambda *a: train_step(*a, **kwargs, sparse_negatives=negatives))
    state0 = init_train_state(jax.random.key(0), cfg, len(vocab), opt)
    lstm0 = zero_state(cfg, 4)
    runs = {}
    for name, fn in (("dense", dense), ("sparse", sparse)):
        s, l, trace = state0, lstm0, []
        for i, b in enumerate(batches):
            s, l, m = fn(s, l, b, jax.random.key(i), jax.random.key(1000 + i))
            trace.append((float(m["loss"]), float(m["grad_norm"])))
        runs[name] = (jax.device_get(s), trace)
    (ds, dtrace), (ss, strace) = runs["dense"], runs["sparse"]
    np.testing.assert_allclose(np.array(strace), np.array(dtrace), rtol=1e-6, atol=1e-6)
    assert any(g > 1.0 for _, g in dtrace)  # some steps were clipped
    for a, b in zip(jax.tree.leaves(ss), jax.tree.leaves(ds)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # the rows of the softmax no step touched are exactly the initial ones
    w0 = np.asarray(state0["params"]["softmax"]["w"])
    touched = np.zeros(len(vocab), bool)
    for i, b in enumerate(batches):
        touched[np.asarray(touched_rows(jax.random.key(i), b, negatives, len(vocab)))[:-1].clip(0, len(vocab) - 1)] = (
            True
        )
    np.testing.assert_array_equal(ss["params"]["softmax"]["w"][~touched], w0[~touched])


def test_touched_rows_are_sorted_unique_and_padded():
    batch = {"fwd_targets": np.array([[5, 5, 7]]), "bwd_targets": np.array([[7, 1, 2]])}
    rows = np.asarray(touched_rows(jax.random.key(0), batch, 4, 1000))
    assert rows.shape == (2 * 4 + 6,)
    real = rows[rows < 1000]
    assert list(real) == sorted(set(real)) and {1, 2, 5, 7} <= set(real)
    assert np.all(rows[len(real) :] == 1000)


def test_sparse_needs_adagrad():
    with pytest.raises(ConfigError, match="softmax_update 'sparse' needs optimizer 'adagrad'"):
        TrainConfig(optimizer="adam", softmax_update="sparse")
    with pytest.raises(ConfigError, match="softmax_update 'rows'"):
        TrainConfig(softmax_update="rows")


PARALLEL = textwrap.dedent(
    """
    import json
    import jax, numpy as np
    from elmo_jax.train.parallel import make_runner
    from elmo_jax.train.losses import make_loss_fn
    from elmo_jax.train.step import init_train_state, make_optimizer, train_step
    from elmo_jax.model.lstm import zero_state
    from tests.test_sparse_softmax import _setup

    cfg, vocab, batches = _setup(rows=8, unroll=4)
    loss = make_loss_fn(len(vocab), 24)
    opt = make_optimizer("adagrad", 0.2, 1.0, 1.0)
    kw = dict(config=cfg, optimizer=opt, loss_fn=loss.fn, dropout_rate=0.0)
    state0 = jax.tree.map(np.asarray, init_train_state(jax.random.key(0), cfg, len(vocab), opt))
    lstm0 = jax.tree.map(np.asarray, zero_state(cfg, 8))
    single = jax.jit(lambda *a: train_step(*a, **kw))
    s, l = state0, lstm0
    for i, b in enumerate(batches[:3]):
        s, l, _ = single(s, l, b, jax.random.key(i), jax.random.key(9))
    ref = jax.tree.leaves(jax.device_get(s))
    out = {}
    for kind in ("pmap", "mesh"):
        runner = make_runner(kind, dict(kw, sparse_negatives=24))
        s, l = runner.put_train_state(state0), runner.put_rows(lstm0, axis=2)
        for i, b in enumerate(batches[:3]):
            s, l, _ = runner.step(s, l, runner.put_rows(b), jax.random.key(i), runner.dropout_rngs(jax.random.key(9)))
        got = jax.tree.leaves(runner.get_train_state(s))
        out[kind] = max(float(np.max(np.abs(np.asarray(a, np.float64) - b))) for a, b in zip(got, ref))
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_sparse_update_over_four_devices_equals_one_dense_device():
    proc = subprocess.run(
        [sys.executable, "-c", PARALLEL], env=device_env(4), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["pmap"] <= 1e-5 and out["mesh"] <= 1e-5, out
