"""4 emulated CPU devices give the loss and update of 1 device on the same global batch, and
each runner compiles its step once: steps after the first compile nothing.

XLA_FLAGS must be set before jax is imported, so the check runs in a subprocess.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import device_env

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from elmo_jax.config import ElmoConfig
    from elmo_jax.data.batches import LMBatcher
    from elmo_jax.data.text_source import InMemorySource
    from elmo_jax.data.vocab import Vocabulary
    from elmo_jax.model.lstm import zero_state
    from elmo_jax.train.losses import make_loss_fn
    from elmo_jax.train.parallel import make_runner
    from elmo_jax.train.step import init_train_state, make_optimizer, train_step

    assert jax.device_count() == 4, jax.devices()
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(event) if event.endswith("backend_compile_duration") else None)
    cfg = ElmoConfig.preset("tiny").replace(dim=16, projection_dim=8, filters=((1, 8), (2, 8)))
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    sents = [list(rng.choice(words, size=rng.integers(1, 10))) for _ in range(200)]
    vocab = Vocabulary.build(sents)
    loss = make_loss_fn(len(vocab), int(sys.argv[1]))
    opt = make_optimizer("adagrad", 0.2, 1.0, 10.0)
    kwargs = dict(config=cfg, optimizer=opt, loss_fn=loss.fn, dropout_rate=0.0)
    state0 = jax.tree.map(np.asarray, init_train_state(jax.random.key(0), cfg, len(vocab), opt))
    lstm0 = jax.tree.map(np.asarray, zero_state(cfg, 8))
    batches = [b for _, b in zip(range(3), LMBatcher(InMemorySource(sents), vocab, 8, 6, 50, seed=1))]
    out = {}
    # One device, plain jit over the global batch.
    single = jax.jit(lambda s, l, b, k1, k2: train_step(s, l, b, k1, k2, **kwargs))
    s, l, losses = state0, lstm0, []
    for i, b in enumerate(batches):
        s, l, m = single(s, l, b, jax.random.key(i), jax.random.key(100 + i))
        losses.append(float(m["loss"]))
    out["single"] = losses
    single_params = jax.tree.leaves(jax.device_get(s["params"]))
    for kind in ("pmap", "mesh"):
        runner = make_runner(kind, kwargs)
        s, l, losses = runner.put_train_state(state0), runner.put_rows(lstm0, axis=2), []
        for i, b in enumerate(batches):
            d_batch, keys = runner.put_rows(b), (jax.random.key(i), runner.dropout_rngs(jax.random.key(100 + i)))
            before = len(compiles)
            s, l, m = runner.step(s, l, d_batch, *keys)
            losses.append(float(runner.metrics(m)["loss"]))
            if i > 0:
                out[kind + "_compiles_after_first_step"] = out.get(kind + "_compiles_after_first_step", 0) + (
                    len(compiles) - before)
        host = runner.get_train_state(s)
        out[kind] = losses
        out[kind + "_max_param_diff"] = max(
            float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(host["params"]), single_params)
        )
    print(json.dumps(out))
    """
)


def _run(num_negatives: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(num_negatives)],
        env=device_env(4),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.fidelity
def test_four_devices_equal_one_device_full_and_sampled_softmax():
    for negatives in (10_000, 16):  # full softmax (vocab <= negatives), then sampled
        out = _run(negatives)
        for kind in ("pmap", "mesh"):
            for a, b in zip(out["single"], out[kind]):
                assert abs(a - b) <= 1e-5, (negatives, kind, out["single"], out[kind])
            assert out[kind + "_max_param_diff"] <= 1e-5, (negatives, kind, out)
        assert out["single"][0] != out["single"][-1]
        # pmap compiled its step twice when the first step's state came from the host
        assert out["pmap_compiles_after_first_step"] == 0 and out["mesh_compiles_after_first_step"] == 0, out
