"""Continued pretraining (--config.init_from): from the bilm-tf fixture model, from an export
of a run here, a contradicting config refused, a restart that reads its checkpoint."""

import json
import shutil

import h5py
import jax
import numpy as np
import pytest

from elmo_jax import batch_to_ids
from elmo_jax.data.text_source import make_source
from elmo_jax.data.vocab import Vocabulary
from elmo_jax.model.bilm import bilm
from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.evaluation import evaluate
from elmo_jax.train import init_from
from elmo_jax.train.init_from import carry_softmax, initial_train_state, load_pretrained
from elmo_jax.train.loop import TrainingError, train
from elmo_jax.train.step import init_train_state, make_optimizer

MICRO = {
    "dim": 16,
    "projection_dim": 8,
    "embedding_dim": 4,
    "filters": [[1, 8], [2, 8], [3, 16]],
    "n_highway": 1,
    "max_characters_per_token": 12,
}
WORDS_A = ["the", "bank", "river", "money", "she", "went", "to", "a", "of", "银行", "取钱", "去"]
# Domain B shares some words with A and has its own.
WORDS_B = ["the", "bank", "she", "a", "loan", "rate", "fee", "paid", "account", "银行", "存钱"]


def _corpus(path, words, n, seed):
    rng = np.random.default_rng(seed)
    path.write_text(
        "\n".join(" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(n)) + "\n", encoding="utf-8"
    )
    return str(path)


def _cfg(tmp, data, **kw):
    base = dict(
        model="tiny",
        data=data,
        heldout=None,
        batch_size=4,
        unroll_steps=5,
        num_negatives=64,
        optimizer="adam",
        learning_rate=0.01,
        epochs=1,
        max_steps=4,
        log_every=1,
        checkpoint_every=2,
        dropout=0.0,
        data_dir=str(tmp / "tfds"),
    )
    base.update(kw)
    return TrainConfig(**base)


def _records(workdir, kind):
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl", encoding="utf-8")]
    return {r["step"]: r for r in rows if r["kind"] == kind}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A run here on domain A, exported: the source of the continued runs below."""
    from elmo_jax.formats.training_run import export

    tmp = tmp_path_factory.mktemp("source")
    cfg = _cfg(tmp, _corpus(tmp / "a.txt", WORDS_A, 60, 0), model_overrides=MICRO, max_steps=3, checkpoint_every=3)
    train(cfg, str(tmp / "run"), progress=False)
    export(tmp / "run", tmp / "model")
    return tmp / "model"


@pytest.mark.fidelity
def test_fixture_model_first_step_outputs_equal_the_fixtures_and_perplexity_falls(bilm_fixtures, tmp_path):
    """A released-format model (options differ from every preset, no softmax): the state a
    run starts from gives bilm-tf's own outputs; the run's held-out perplexity falls."""
    model = bilm_fixtures / "model"
    vocab = Vocabulary.build([line.split() for line in WORDS_B])
    optimizer = make_optimizer("adam", 0.01, 1.0, 10.0)
    pretrained = load_pretrained(str(model))
    assert pretrained.softmax is None  # released models ship no softmax: every row fresh
    fresh = init_train_state(jax.random.key(0), pretrained.config, len(vocab), optimizer)
    messages = []
    state = initial_train_state(fresh, pretrained, vocab, optimizer, log=messages.append)
    assert "carried over: 0 of" in messages[-1]
    params = state["params"]["bilm"]
    sentences = json.loads((model / "lm_embeddings_sentences.json").read_text())
    expected = [h5py.File(model / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    p = pretrained.config.projection_dim
    forward = jax.jit(bilm, static_argnums=1)
    lstm_state = None
    for i in range(3):  # the first batches, LSTM state carried as the fixture's were made
        batch = [sentences[k][i].split(" ") for k in range(3)]
        layers, lstm_state = forward(params, pretrained.config, batch_to_ids(batch), lstm_state)
        for k in range(3):
            top = np.asarray(layers[-1, k, : len(batch[k])])
            np.testing.assert_allclose(
                np.stack([top[:, :p], top[:, p:]]),
                expected[k][str(i)][...],
                atol=1e-5,
                rtol=0,
                err_msg=f"batch {i} sentence {k}",
            )

    data = _corpus(tmp_path / "b.txt", WORDS_B, 80, 1)
    heldout = _corpus(tmp_path / "b-heldout.txt", WORDS_B, 20, 2)
    workdir = tmp_path / "run"
    logged = []
    summary = train(
        _cfg(tmp_path, data, heldout=heldout, init_from=str(model), max_steps=20, log_every=5, checkpoint_every=20),
        str(workdir),
        progress=False,
        log=logged.append,
    )
    evals = _records(workdir, "eval")
    assert sorted(evals) == [0, 20]
    # The loop's step-0 evaluation scores the state checked above.
    run_vocab = Vocabulary.load(workdir / "vocab.txt")
    start = initial_train_state(
        init_train_state(jax.random.key(0), pretrained.config, len(run_vocab), optimizer),
        pretrained,
        run_vocab,
        optimizer,
        log=lambda m: None,
    )
    again = evaluate(
        start["params"],
        pretrained.config,
        make_source(heldout, "test", str(tmp_path / "tfds")),
        run_vocab,
        unroll_steps=5,
    )
    assert evals[0]["perplexity"] == pytest.approx(again["perplexity"], rel=1e-5)
    # Random sentences of 11 words: about 12 is the floor; the run starts near 19.
    assert summary["eval"]["perplexity"] < 0.8 * evals[0]["perplexity"], (evals[0], summary["eval"])
    assert any("carried over: 0 of" in m for m in logged)
    recorded = json.loads((workdir / "config.json").read_text())
    assert TrainConfig(**recorded).elmo_config() == pretrained.config  # the run describes itself


def test_softmax_rows_of_an_export_are_carried_bit_for_bit(exported, tmp_path):
    data = _corpus(tmp_path / "b.txt", WORDS_B, 60, 3)
    logged = []
    train(
        _cfg(tmp_path, data, init_from=str(exported), max_steps=1, checkpoint_every=1),
        str(tmp_path / "run"),
        progress=False,
        log=logged.append,
    )
    vocab = Vocabulary.load(tmp_path / "run" / "vocab.txt")
    source_tokens = (exported / "vocab.txt").read_text(encoding="utf-8").split()
    shared = [t for t in vocab.tokens if t in source_tokens]
    assert 3 < len(shared) < len(vocab)  # some rows carried, some fresh
    assert any(f"carried over: {len(shared)} of {len(vocab)}" in m for m in logged)

    pretrained = load_pretrained(str(exported))
    optimizer = make_optimizer("adam", 0.01, 1.0, 10.0)
    fresh = init_train_state(jax.random.key(0), pretrained.config, len(vocab), optimizer)
    softmax, carried = carry_softmax(fresh["params"]["softmax"], vocab, pretrained)
    assert carried == len(shared)
    with h5py.File(exported / "softmax.hdf5", "r") as f:
        w, b = f["softmax/W"][...], f["softmax/b"][...]
    for token in vocab.tokens:
        i = vocab.id_of(token)
        if token in source_tokens:
            j = source_tokens.index(token)
            assert softmax["w"][i].tobytes() == w[j].tobytes() and softmax["b"][i].tobytes() == b[j].tobytes()
        else:  # as a fresh run with this seed has it
            assert softmax["w"][i].tobytes() == np.asarray(fresh["params"]["softmax"]["w"][i]).tobytes()
    # The biLM is the export's, bit for bit.
    from elmo_jax.formats.hdf5 import load_weights

    for x, y in zip(
        jax.tree.leaves(pretrained.bilm), jax.tree.leaves(load_weights(exported / "weights.hdf5", pretrained.config))
    ):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_a_config_that_contradicts_the_model_is_refused(exported, tmp_path):
    data = _corpus(tmp_path / "b.txt", WORDS_B, 20, 4)
    cfg = _cfg(tmp_path, data, init_from=str(exported), model_overrides={**MICRO, "dim": 32, "n_layers": 1})
    with pytest.raises(TrainingError) as e:
        train(cfg, str(tmp_path / "run"), progress=False)
    assert "model_overrides.dim: the config has 32, the model has 16" in str(e.value)
    assert "model_overrides.n_layers: the config has 1, the model has 2" in str(e.value)
    # A folder that is not there is named as such (not looked up as a model name).
    with pytest.raises(TrainingError, match="init_from folder 'no/such/model' not found"):
        train(cfg.replace(init_from="no/such/model"), str(tmp_path / "run2"), progress=False)


def test_a_restart_reads_the_checkpoint_not_init_from(exported, tmp_path):
    data = _corpus(tmp_path / "b.txt", WORDS_B, 60, 5)
    source = tmp_path / "source"
    shutil.copytree(exported, source)
    cfg = _cfg(tmp_path, data, init_from=str(source))
    train(cfg, str(tmp_path / "straight"), progress=False)
    train(cfg.replace(max_steps=2), str(tmp_path / "resumed"), progress=False)
    shutil.rmtree(source)  # a restart must not need it
    logged = []
    train(cfg, str(tmp_path / "resumed"), progress=False, log=logged.append)
    assert any("resuming from" in m for m in logged) and not any("init_from" in m for m in logged)
    straight, resumed = _records(tmp_path / "straight", "train"), _records(tmp_path / "resumed", "train")
    assert sorted(resumed) == [1, 2, 3, 4]
    for step in (3, 4):
        assert resumed[step]["loss"] == pytest.approx(straight[step]["loss"], abs=1e-6)


def test_names_and_urls_go_to_the_hub_and_folders_do_not(bilm_fixtures, monkeypatch):
    asked = []

    def resolve_model(spec, *, offline=None, progress=True):
        asked.append(spec)
        return bilm_fixtures / "model"

    monkeypatch.setattr(init_from, "resolve_model", resolve_model)
    for spec in ("fixture-model", "https://example.org/models/fixture.tar.gz"):
        assert load_pretrained(spec, progress=False).source == str(bilm_fixtures / "model")
    assert load_pretrained(str(bilm_fixtures / "model")).softmax is None
    assert asked == ["fixture-model", "https://example.org/models/fixture.tar.gz"]
    with pytest.raises(TrainingError, match="is a file"):
        load_pretrained(str(bilm_fixtures / "model" / "options.json"))


def test_a_softmax_without_its_vocabulary_is_refused(exported, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(exported, folder)
    (folder / "vocab.txt").unlink()
    with pytest.raises(TrainingError, match="has softmax.hdf5 but no vocab.txt"):
        load_pretrained(str(folder))
    (folder / "softmax.hdf5").unlink()  # the biLM alone: every softmax row fresh
    assert load_pretrained(str(folder)).softmax is None
