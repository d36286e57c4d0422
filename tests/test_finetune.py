"""Heads on frozen ELMo: only head parameters move, the loss goes down, the example runs."""

import importlib.util

import jax
import numpy as np
import optax
import pytest

from elmo_jax import Elmo, batch_to_ids
from elmo_jax.finetune import accuracy, init_tagger, make_train_step, pad_labels, pad_layers, tagger_loss, train_tagger
from tests.conftest import REPO

SENTS = [
    ["the", "bank", "of", "the", "river"],
    ["she", "went", "to", "the", "bank"],
    ["a", "river"],
    ["she", "went"],
    ["the", "money"],
    ["a", "bank", "of", "money"],
]
TAGS = {
    "the": "DET",
    "a": "DET",
    "bank": "NOUN",
    "river": "NOUN",
    "money": "NOUN",
    "of": "ADP",
    "to": "ADP",
    "she": "PRON",
    "went": "VERB",
}


@pytest.fixture(scope="module")
def elmo():
    return Elmo.random("tiny", seed=2, batch_size=8)


def _data(elmo):
    classes = sorted(set(TAGS.values()))
    index = {c: i for i, c in enumerate(classes)}
    layers, mask = pad_layers(elmo.embed(SENTS))
    labels = pad_labels([[TAGS[w] for w in s] for s in SENTS], index, layers.shape[2])
    return layers, labels, mask, len(classes)


@pytest.mark.parametrize("head", ["mix", "components"])
def test_on_the_fly_training_updates_only_the_head(elmo, head):
    layers, labels, mask, n_classes = _data(elmo)
    before = jax.tree.map(lambda a: np.array(a, copy=True), elmo.params)
    params = init_tagger(jax.random.key(0), elmo.config, n_classes, head, out_dim=16)
    step = make_train_step(head, optax.adam(5e-2), penalty=1e-3, config=elmo.config, on_the_fly=True)
    ids = batch_to_ids(SENTS, elmo.config.char_cnn.max_characters_per_token)
    batch = {"char_ids": ids, "lengths": np.array([len(s) for s in SENTS], np.int32), "labels": labels, "mask": mask}
    opt_state = optax.adam(5e-2).init(params)
    first = float(tagger_loss(params, layers, labels, mask, head, 1e-3))
    for _ in range(40):
        params, opt_state, loss, grads = step(params, opt_state, batch, elmo.params)
        # The gradient has exactly the head's structure: no biLM leaf in it.
        assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert float(loss) < 0.5 * first
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(elmo.params)):
        np.testing.assert_array_equal(np.asarray(b), a)
    # On-the-fly layers are the precomputed ones: same loss either way.
    from elmo_jax.finetune import frozen_layers

    fly = frozen_layers(elmo.params, elmo.config, batch["char_ids"], batch["lengths"])
    np.testing.assert_allclose(
        float(tagger_loss(params, fly, labels, mask, head, 1e-3)),
        float(tagger_loss(params, layers, labels, mask, head, 1e-3)),
        rtol=1e-5,
    )


def test_gradient_of_the_bilm_is_zero_through_stop_gradient(elmo):
    from elmo_jax.finetune import frozen_layers

    ids = batch_to_ids(SENTS[:2], elmo.config.char_cnn.max_characters_per_token)
    g = jax.grad(lambda p: frozen_layers(p, elmo.config, ids, np.array([5, 5], np.int32)).sum())(elmo.params)
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(g))


def test_precomputed_training_with_penalty_improves_accuracy(elmo):
    layers, labels, mask, n_classes = _data(elmo)
    params = init_tagger(jax.random.key(1), elmo.config, n_classes, "mix")
    start = accuracy(params, layers, labels, mask, "mix")
    result = train_tagger(params, layers, labels, mask, "mix", optax.adam(5e-2), steps=80, batch_size=4, penalty=1e-3)
    assert result.losses[-1] < result.losses[0]
    assert accuracy(result.params, layers, labels, mask, "mix") > max(start, 0.8)
    for head in ("layer:0", "layer:2"):
        p = init_tagger(jax.random.key(1), elmo.config, n_classes, head)
        r = train_tagger(p, layers, labels, mask, head, optax.sgd(0.5), steps=40, batch_size=6)
        assert r.losses[-1] < r.losses[0]
        assert set(r.params) == {"classifier"}
    with pytest.raises(ValueError, match="layer 3 does not exist"):
        init_tagger(jax.random.key(0), elmo.config, n_classes, "layer:3")
    with pytest.raises(ValueError, match="head must be"):
        init_tagger(jax.random.key(0), elmo.config, n_classes, "lstm")


def test_layer_norm_mix_head_normalises_over_real_tokens_and_trains(elmo):
    """``"mix:layer_norm"``: each layer at zero mean / unit variance over the batch's real
    tokens before the weighted sum; padding never enters the statistics, and it trains."""
    from elmo_jax.finetune import DEFAULT_PENALTY, tagger_logits

    layers, labels, mask, n_classes = _data(elmo)
    params = init_tagger(jax.random.key(3), elmo.config, n_classes, "mix:layer_norm")
    assert set(params) == {"mix", "classifier"}  # the same parameters as "mix"
    params["mix"]["scalars"] = np.array([0.5, -1.0, 2.0], np.float32)
    real = layers[:, mask]  # [L+1, n_real, D]
    normed = (real - real.mean(axis=(1, 2), keepdims=True)) / real.std(axis=(1, 2), keepdims=True)
    w = np.exp(params["mix"]["scalars"]) / np.exp(params["mix"]["scalars"]).sum()
    expected = np.einsum("l,lnd->nd", w, normed) @ params["classifier"]["w"] + params["classifier"]["b"]
    garbage = np.where(mask[None, :, :, None], layers, 1e3).astype(np.float32)
    got = np.asarray(tagger_logits(params, garbage, "mix:layer_norm", mask))[mask]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    plain = np.asarray(tagger_logits(params, layers, "mix", mask))[mask]
    assert np.abs(plain - got).max() > 1e-2  # the switch changes the head
    np.testing.assert_allclose(
        np.asarray(tagger_logits(params, layers[:, 0], "mix")),  # one sentence
        np.asarray(tagger_logits(params, layers, "mix"))[0],
        rtol=1e-5,
        atol=1e-6,
    )
    start = accuracy(params, layers, labels, mask, "mix:layer_norm")
    result = train_tagger(params, layers, labels, mask, "mix:layer_norm", optax.adam(5e-2), steps=80, batch_size=4)
    assert result.losses[-1] < result.losses[0]
    assert accuracy(result.params, layers, labels, mask, "mix:layer_norm") > max(start, 0.8)
    # One default penalty for every entry point: the loss counts it unless told otherwise.
    ce = float(tagger_loss(params, layers, labels, mask, "mix", penalty=0.0))
    np.testing.assert_allclose(
        float(tagger_loss(params, layers, labels, mask, "mix")),
        ce + DEFAULT_PENALTY * float(np.sum(params["mix"]["scalars"] ** 2)),
        rtol=1e-6,
    )
    step = make_train_step("mix", optax.sgd(0.0))
    _, _, loss, _ = step(params, optax.sgd(0.0).init(params), {"layers": layers, "labels": labels, "mask": mask})
    np.testing.assert_allclose(float(loss), float(tagger_loss(params, layers, labels, mask, "mix")), rtol=1e-6)


def test_bad_tagging_data_and_mismatched_heads_are_named(elmo):
    """Misaligned tags, labels outside the classes, wrong row counts, params of another
    head, a layer that does not exist and the layers-last layout all fail loudly instead
    of training on wrong data."""
    layers, labels, mask, n_classes = _data(elmo)
    mix = init_tagger(jax.random.key(0), elmo.config, n_classes, "mix")
    classes = sorted(set(TAGS.values()))
    short = pad_labels(
        [[TAGS[w] for w in s][:-1] for s in SENTS], {c: i for i, c in enumerate(classes)}, layers.shape[2]
    )  # one tag missing per sentence
    with pytest.raises(ValueError, match="sentence 0: token 4 has no label .*one tag per token"):
        train_tagger(mix, layers, short, mask, "mix", steps=1)
    with pytest.raises(ValueError, match="no label"):
        accuracy(mix, layers, short, mask, "mix")
    two_classes = init_tagger(jax.random.key(0), elmo.config, 2, "mix")
    with pytest.raises(ValueError, match=r"label \d is not a class of this head \(n_classes=2\)"):
        train_tagger(two_classes, layers, labels, mask, "mix", steps=1)
    with pytest.raises(ValueError, match=r"must both be \[N, T\]"):
        train_tagger(mix, layers, labels[:-1], mask[:-1], "mix", steps=1)
    with pytest.raises(ValueError, match="initialised for head 'mix', not 'components'"):
        train_tagger(mix, layers, labels, mask, "components", steps=1)
    probe = init_tagger(jax.random.key(0), elmo.config, n_classes, "layer:0")
    from elmo_jax.finetune import tagger_logits

    assert tagger_logits(probe, layers[:, 0], "layer:1").shape == (layers.shape[2], n_classes)  # one sentence
    for head in ("layer:7", "layer:-1"):
        with pytest.raises(ValueError, match="does not exist"):
            train_tagger(probe, layers, labels, mask, head, steps=1)
    swapped = np.swapaxes(layers, 0, 1)  # [N, L+1, T, D], as np.stack of embed() output is
    with pytest.raises(ValueError, match=r"layers go first"):
        tagger_loss(mix, swapped, labels[:3], mask[:3], "mix")
    with pytest.raises(ValueError, match="layers='all'"):
        pad_layers(elmo.embed(SENTS, layers="top"))
    step = make_train_step("mix", optax.adam(1e-2), config=elmo.config, on_the_fly=True)
    ids = batch_to_ids(SENTS, elmo.config.char_cnn.max_characters_per_token)
    batch = {"char_ids": ids, "lengths": np.array([len(s) for s in SENTS], np.int32), "labels": labels, "mask": mask}
    with pytest.raises(ValueError, match="bilm_params=elmo.params"):
        step(mix, optax.adam(1e-2).init(mix), batch)
    del batch["lengths"]
    with pytest.raises(ValueError, match="batch lacks lengths"):
        step(mix, optax.adam(1e-2).init(mix), batch, elmo.params)


def test_example_runs_quick(tmp_path, capsys):
    Elmo.random("tiny", seed=0).save(tmp_path / "model")
    spec = importlib.util.spec_from_file_location("finetune_heads", REPO / "examples" / "finetune_heads.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (
        mod.main(
            [
                str(tmp_path / "model"),
                "--quick",
                "--workdir",
                str(tmp_path / "work"),
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for head in ("mix", "components", "layer:0", "layer:1", "layer:2", "majority"):
        assert f"\n{head} " in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "needs matplotlib: pip install -e '.[plot]'" in out
    else:  # the trained mixes' layer weights, drawn
        assert f"wrote {tmp_path / 'plots' / 'scalar_mix.png'}" in out
        assert (tmp_path / "plots" / "scalar_mix.png").read_bytes()[:4] == b"\x89PNG"
