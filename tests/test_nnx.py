"""ELMo as a Flax NNX layer: same numbers as Elmo.embed, a frozen biLM that no optimizer
touches, trainable mixes, bounded compiles, the Linen bridge, task-model checkpoints."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen, nnx

from elmo_jax import Elmo, ElmoConfig
from elmo_jax.embedding.embedder import n_row_buckets, time_buckets
from elmo_jax.errors import ElmoError
from elmo_jax.finetune import pad_layers
from elmo_jax.model import heads
from elmo_jax.model.bilm import init_params
from elmo_jax.nnx import (
    LINEN_COLLECTION,
    ComponentHead,
    ElmoLayer,
    ElmoWeight,
    ScalarMix,
    batch_inputs,
    parameter_counts,
    restore_params,
    save_params,
)
from tests.conftest import REPO

SENTS = [
    ["the", "bank", "of", "the", "river"],
    ["she", "went", "to", "the", "bank", "with", "money", "."],
    ["a"],
    "she went home",
]
MIX = {"scalars": jnp.array([0.3, -0.2, 0.5]), "gamma": jnp.array(1.7)}
MIX2 = {"scalars": jnp.array([-1.0, 0.4, 0.1]), "gamma": jnp.array(0.6)}


# Small enough to compile in seconds (the same sizes as examples/finetune_heads.py --quick).
MICRO = ElmoConfig.preset("tiny").replace(
    dim=32,
    projection_dim=16,
    embedding_dim=4,
    n_highway=1,
    filters=[[1, 8], [2, 8], [3, 16]],
    max_characters_per_token=16,
)


def _random_elmo(config: ElmoConfig, seed: int) -> Elmo:
    """Random weights drawn with numpy (Elmo.random's initialisers take 10+ s eagerly on the
    shared 2-core machine); the padding row of the char table stays zero."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: init_params(jax.random.key(0), config))
    params = jax.tree.map(lambda a: (0.3 * rng.standard_normal(a.shape)).astype(np.float32), shapes)
    params["char_embed"][0] = 0.0
    return Elmo(config, params, batch_size=8)


@pytest.fixture(scope="module")
def elmo():
    return _random_elmo(MICRO, seed=3)


@nnx.jit(static_argnums=3)
def _forward(model, ids, mask, deterministic=None):
    return model(ids, mask, deterministic=deterministic)


@pytest.fixture(scope="module")
def inputs(elmo):
    return batch_inputs(SENTS, elmo.config)


def _set_mix(mix: ScalarMix, params: dict) -> None:
    mix.scalars[...] = params["scalars"]
    mix.gamma[...] = params["gamma"]


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


class Tagger(nnx.Module):
    """The paper's task model: one mix into a biLSTM, a second one beside its output."""

    def __init__(self, elmo, n_classes: int, *, trainable: bool = False, rngs: nnx.Rngs):
        self.elmo = ElmoLayer(elmo, num_output_representations=2, trainable=trainable, dropout=0.2, rngs=rngs)
        d = elmo.config.output_dim
        self.rnn = nnx.Bidirectional(
            nnx.RNN(nnx.LSTMCell(d, 8, rngs=rngs)), nnx.RNN(nnx.LSTMCell(d, 8, rngs=rngs)), rngs=rngs
        )
        self.out = nnx.Linear(16 + d, n_classes, rngs=rngs)

    def __call__(self, ids, mask):
        x, y = self.elmo(ids, mask)
        h = self.rnn(x, seq_lengths=jnp.sum(mask, axis=1))
        return self.out(jnp.concatenate([h, y], axis=-1))


def _loss(model, ids, mask, labels):
    logits = model(ids, mask)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.sum(ce * mask) / jnp.sum(mask) + 1e-3 * model.elmo.penalty()


@nnx.jit
def _train_step(model, optimizer, ids, mask, labels):
    loss, grads = nnx.value_and_grad(_loss)(model, ids, mask, labels)
    optimizer.update(model, grads)
    return loss, grads


def _labels(mask):
    return jnp.asarray(np.arange(mask.size).reshape(mask.shape) % 3)


@pytest.mark.fidelity
def test_outputs_equal_embed_mix_and_zero_at_padding(elmo, inputs):
    ids, mask = inputs
    assert ids.shape == (4, 10, 16) and mask.sum() == 5 + 8 + 1 + 3
    layer = ElmoLayer(elmo, num_output_representations=2, rngs=nnx.Rngs(0))
    _set_mix(layer.mixes[0], MIX)
    _set_mix(layer.mixes[1], MIX2)
    layer.eval()
    out = _forward(layer, ids, mask)
    assert len(out) == 2
    for params, got in zip((MIX, MIX2), out):
        assert got.shape == (4, 10, elmo.config.output_dim)
        ref = elmo.embed(SENTS, layers="mix", mix_params=params)
        for i, r in enumerate(ref):
            n = len(r)
            np.testing.assert_allclose(np.asarray(got[i, :n]), r, atol=1e-6, rtol=0)
            assert not np.asarray(got[i, n:]).any()
    # The mask defaults to the positions that hold a token.
    np.testing.assert_allclose(np.asarray(_forward(layer, ids, None)[0]), np.asarray(out[0]), atol=1e-6, rtol=0)

    # Layer norm over the real tokens: the pure function on embed's layers, same statistics.
    ln = ElmoLayer(elmo, layer_norm=True, rngs=nnx.Rngs(0))
    _set_mix(ln.mixes[0], MIX)
    ln.eval()
    got = np.asarray(_forward(ln, ids, mask)[0])
    layers, m = pad_layers(elmo.embed(SENTS))
    ref = np.asarray(heads.scalar_mix(MIX, jnp.asarray(layers), jnp.asarray(m), layer_norm=True))
    np.testing.assert_allclose(got[:, : ref.shape[1]][m], ref[m], atol=1e-5, rtol=0)
    assert not got[~np.pad(m, ((0, 0), (0, 2)))].any()

    # Dropout on the mixed vector in training mode only (the bridge test passes deterministic=True).
    layer.train()
    dropped = np.asarray(_forward(layer, ids, mask)[0])
    kept = np.asarray(out[0])
    zeroed = (dropped == 0) & (kept != 0)
    assert 0.3 < zeroed.sum() / (kept != 0).sum() < 0.7  # rate 0.5
    np.testing.assert_allclose(dropped[~zeroed], 2 * kept[~zeroed], rtol=1e-6, atol=1e-6)


def test_component_head_and_scalar_mix_call_the_pure_functions(elmo, inputs):
    ids, mask = inputs
    layer = ElmoLayer(elmo, rngs=nnx.Rngs(0))
    layers = nnx.jit(lambda m, i, k: m.all_layers(i, k))(layer, ids, mask)
    head = ComponentHead(elmo.config, out_dim=7, rngs=nnx.Rngs(1))
    got = np.asarray(head(layers))
    assert got.shape == (4, 10, 7)
    np.testing.assert_array_equal(got, np.asarray(heads.component_head({"w": head.w[...]}, layers)))
    mix = ScalarMix(3, params=MIX2)
    np.testing.assert_array_equal(np.asarray(mix(layers)), np.asarray(heads.scalar_mix(MIX2, layers)))
    assert float(mix.penalty()) == pytest.approx(float(heads.scalar_mix_penalty(MIX2)))
    with pytest.raises(ValueError, match="expected \\(3,\\)"):
        ScalarMix(3, params={"scalars": jnp.zeros(2), "gamma": 1.0})


def test_frozen_bilm_stays_bit_identical_and_the_optimizer_holds_no_bilm_state(elmo, inputs):
    ids, mask = inputs
    model = Tagger(elmo, 3, rngs=nnx.Rngs(0))
    bilm_before = _leaves(nnx.state(model, ElmoWeight))
    mixes_before = _leaves(nnx.state(model.elmo.mixes))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    opt_paths = [p for p, _ in nnx.to_flat_state(nnx.state(optimizer.opt_state))]
    assert opt_paths and not any("bilm" in map(str, p) for p in opt_paths)
    n_trainable, n_frozen = parameter_counts(model)
    assert n_frozen == sum(a.size for a in jax.tree.leaves(elmo.params))
    # Adam: mu and nu per trainable scalar, nothing for the biLM.
    assert sum(np.size(a) for a in jax.tree.leaves(nnx.state(optimizer.opt_state))) == 2 * n_trainable + 1

    for _ in range(2):
        loss, grads = _train_step(model, optimizer, ids, mask, _labels(mask))
    assert np.isfinite(float(loss))
    assert not nnx.state(grads, ElmoWeight)  # no gradient for the biLM at all
    for a, b in zip(bilm_before, _leaves(nnx.state(model, ElmoWeight))):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(mixes_before, _leaves(nnx.state(model.elmo.mixes))))
    # Even a gradient asked for the frozen weights is zero: the layers are cut off.
    g = nnx.jit(nnx.grad(_loss, argnums=nnx.DiffState(0, ElmoWeight)))(model, ids, mask, _labels(mask))
    assert all(not a.any() for a in _leaves(g))


def test_trainable_bilm_moves_and_is_in_the_optimizer(elmo, inputs):
    ids, mask = inputs
    model = Tagger(elmo, 3, trainable=True, rngs=nnx.Rngs(0))
    n_trainable, n_frozen = parameter_counts(model)
    assert n_frozen == 0 and n_trainable > sum(a.size for a in jax.tree.leaves(elmo.params))
    before = _leaves(model.elmo.bilm)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    assert any("bilm" in map(str, p) for p, _ in nnx.to_flat_state(nnx.state(optimizer.opt_state)))
    _train_step(model, optimizer, ids, mask, _labels(mask))
    after = _leaves(model.elmo.bilm)
    moved = [not np.array_equal(a, b) for a, b in zip(before, after)]
    assert sum(moved) >= len(moved) - 1  # all but possibly an unused one
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(elmo.params)[0]), before[0])  # the Elmo is untouched


def test_compiles_are_bounded_by_the_buckets(elmo):
    layer = ElmoLayer(elmo, rngs=nnx.Rngs(0))
    traces = []

    @nnx.jit
    def forward(m, ids, mask):
        traces.append(ids.shape)
        return m(ids, mask)[0]

    rng = np.random.default_rng(0)
    for n_rows in (1, 2, 1, 2):
        for max_len in (1, 4, 7, 9, 3):
            sents = [["w"] * int(rng.integers(1, max_len + 1)) for _ in range(n_rows - 1)] + [["w"] * max_len]
            ids, mask = batch_inputs(sents, elmo.config)
            assert forward(layer, ids, mask).shape[:2] == mask.shape
    # 20 calls; lengths 1..9 fall in 2 time buckets (6, 10), 1 or 2 rows in 2 row buckets.
    assert len(traces) == len(set(traces)) == 2 * 2 == len(time_buckets(9)) * n_row_buckets(2)


@pytest.mark.fidelity
def test_linen_bridge_gives_the_same_outputs(elmo, inputs):
    ids, mask = inputs
    module = nnx.bridge.to_linen(ElmoLayer, elmo, num_output_representations=2)
    variables = jax.jit(lambda k: module.init(k, ids, mask, deterministic=True))(jax.random.key(0))
    assert set(variables) == {"params", LINEN_COLLECTION}
    assert set(variables["params"]) == {"mixes"}  # only the mixes train; the biLM sits apart
    params = jax.tree_util.tree_map(lambda x: x, dict(variables["params"]))
    params["mixes"] = {
        0: {"scalars": MIX["scalars"], "gamma": MIX["gamma"]},
        1: {"scalars": MIX2["scalars"], "gamma": MIX2["gamma"]},
    }
    got = jax.jit(lambda v: module.apply(v, ids, mask, deterministic=True))(
        {"params": params, LINEN_COLLECTION: variables[LINEN_COLLECTION]}
    )

    layer = ElmoLayer(elmo, num_output_representations=2, rngs=nnx.Rngs(0))
    _set_mix(layer.mixes[0], MIX)
    _set_mix(layer.mixes[1], MIX2)
    want = _forward(layer, ids, mask, True)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-6, rtol=0)

    class LinenTagger(linen.Module):
        @linen.compact
        def __call__(self, ids, mask):
            (x,) = nnx.bridge.to_linen(ElmoLayer, elmo, dropout=0.0)(ids, mask)
            return linen.Dense(3)(x)

    v = jax.jit(lambda k: LinenTagger().init(k, ids, mask))(jax.random.key(1))
    assert set(v) == {"params", LINEN_COLLECTION} and set(v["params"]) == {"ToLinen_0", "Dense_0"}


def test_task_model_save_restore_round_trip(elmo, inputs, tmp_path):
    ids, mask = inputs
    model = Tagger(elmo, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    _train_step(model, optimizer, ids, mask, _labels(mask))
    model.eval()
    tag = nnx.jit(lambda m, i, k: m(i, k))
    want = np.asarray(tag(model, ids, mask))
    save_params(model, tmp_path / "ckpt")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_params(model, tmp_path / "ckpt")
    save_params(model, tmp_path / "ckpt", overwrite=True)  # its own folder: replaced whole
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # no temporary or old folder left
    # A folder holding anything else (here the biLM's own files) is never replaced.
    elmo.save(tmp_path / "model")
    with pytest.raises(FileExistsError, match="options.json, weights.hdf5"):
        save_params(model, tmp_path / "model", overwrite=True)
    assert sorted(os.listdir(tmp_path / "model")) == ["options.json", "weights.hdf5"]

    fresh = Tagger(elmo, 3, rngs=nnx.Rngs(42))
    fresh.eval()
    assert not np.allclose(np.asarray(tag(fresh, ids, mask)), want)
    restore_params(fresh, tmp_path / "ckpt")
    np.testing.assert_array_equal(np.asarray(tag(fresh, ids, mask)), want)

    # The frozen biLM is not in the checkpoint; a trainable one is.
    saved = ocp.StandardCheckpointer().restore(tmp_path / "ckpt" / "params")
    assert set(saved) == {"elmo", "rnn", "out"} and set(saved["elmo"]) == {"mixes"}
    trainable = Tagger(elmo, 3, trainable=True, rngs=nnx.Rngs(0))
    save_params(trainable, tmp_path / "ckpt_trainable")
    saved = ocp.StandardCheckpointer().restore(tmp_path / "ckpt_trainable" / "params")
    assert set(saved["elmo"]) == {"mixes", "bilm"}
    assert len(jax.tree.leaves(saved["elmo"]["bilm"])) == len(jax.tree.leaves(elmo.params))

    # Restoring beside other frozen weights, or into another architecture, is refused.
    other = Tagger(_random_elmo(MICRO, seed=4), 3, rngs=nnx.Rngs(0))
    with pytest.raises(ElmoError, match="other frozen biLM weights"):
        restore_params(other, tmp_path / "ckpt")
    with pytest.raises(ElmoError, match="other frozen biLM weights"):
        restore_params(trainable, tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        restore_params(fresh, tmp_path / "missing")


def test_built_from_a_model_folder_and_bad_inputs_named(elmo, tmp_path):
    elmo.save(tmp_path / "model")
    layer = ElmoLayer(str(tmp_path / "model"), rngs=nnx.Rngs(0))
    for a, b in zip(_leaves(layer.bilm), jax.tree.leaves(elmo.params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        ElmoLayer(tmp_path / "nowhere", rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="model folder or a model name"):
        ElmoLayer(elmo.params, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="num_output_representations"):
        ElmoLayer(elmo, num_output_representations=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="char ids must be \\[B, T, 16\\]"):
        layer(jnp.zeros((2, 5), jnp.int32))
    with pytest.raises(ValueError, match="mask must be"):
        layer(jnp.zeros((2, 5, 16), jnp.int32), jnp.ones((2, 4), bool))
    with pytest.raises(TypeError, match="wrap a single sentence"):
        batch_inputs("one sentence", elmo.config)
    with pytest.raises(ValueError, match="fewer than the 2 sentences"):
        batch_inputs(["a b", "c"], elmo.config, rows=1)
    ids, mask = batch_inputs(["a b", "c"], elmo.config, rows=5)
    assert ids.shape == (5, 6, 16) and mask.tolist()[:3] == [
        [True, True] + [False] * 4,
        [True] + [False] * 5,
        [False] * 6,
    ]


def test_example_runs_quick(tmp_path, capsys):
    _random_elmo(MICRO, seed=0).save(tmp_path / "model")
    spec = importlib.util.spec_from_file_location("flax_tagger", REPO / "examples" / "flax_tagger.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(tmp_path / "model"), "--quick", "--workdir", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    for row in ("nnx tagger", "mix", "components", "majority"):
        assert f"\n{row} " in out
    assert "trainable parameters" in out and "frozen" in out
