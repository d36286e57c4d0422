import json

import numpy as np
import pytest

from elmo_jax import Elmo, ElmoConfig, batch_to_ids
from elmo_jax.embedding.embedder import row_bucket, scan_length_bucket, time_bucket, time_buckets
from elmo_jax.errors import ElmoError
from tests.conftest import assert_close_across_programs


@pytest.fixture(scope="module")
def tiny():
    return Elmo.random("tiny", seed=0, batch_size=8)


@pytest.mark.fidelity
def test_embed_shapes_order_strings_and_token_lists(tiny):
    sents = ["a b c", ["d", "e"], "", "   ", "f " * 20, ["银行", "取钱"]]
    out = tiny.embed(sents)
    assert [v.shape for v in out] == [(3, 3, 64), (3, 2, 64), (3, 0, 64), (3, 0, 64), (3, 20, 64), (3, 2, 64)]
    assert all(v.dtype == np.float32 for v in out)
    # Same vectors whatever the batch company and order.
    alone = tiny.embed(["a b c"])[0]
    assert_close_across_programs(out[0], alone)
    assert tiny.embed([]) == []


def test_deterministic_by_default_and_stateful_carries(tiny):
    a = tiny.embed(["the bank of the river"])[0]
    b = tiny.embed(["the bank of the river"])[0]
    np.testing.assert_array_equal(a, b)
    tiny.reset_state()
    s1 = tiny.embed(["the bank of the river"], stateful=True)[0]
    s2 = tiny.embed(["the bank of the river"], stateful=True)[0]
    np.testing.assert_allclose(s1, a, atol=1e-6)
    assert np.abs(s2[1:] - s1[1:]).max() > 1e-4
    tiny.reset_state()
    np.testing.assert_allclose(tiny.embed(["the bank of the river"], stateful=True)[0], a, atol=1e-6)
    tiny.reset_state()
    # Both kinds of call run the same executable: one compile per (rows, time), as documented.
    fresh = Elmo(tiny.config, tiny.params, batch_size=4)
    full = ["the bank of the river"] * 4
    fresh.embed(full)
    fresh.embed(full, stateful=True)
    assert fresh.compiled_shapes == {(4, 6)} and fresh._forward._cache_size() == 1


@pytest.mark.fidelity
def test_stateful_reproduces_reference_fixture(bilm_fixtures):
    model = bilm_fixtures / "model"
    elmo = Elmo.load(model, batch_size=3)
    sentences = json.loads((model / "lm_embeddings_sentences.json").read_text())
    import h5py

    expected = [h5py.File(model / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    for i in range(10):
        out = elmo.embed([sentences[k][i].split(" ") for k in range(3)], stateful=True)
        for k in range(3):
            top = out[k][-1]
            np.testing.assert_allclose(np.stack([top[:, :16], top[:, 16:]]), expected[k][str(i)][...], atol=1e-5)


@pytest.mark.fidelity
def test_save_load_round_trip(tiny, tmp_path):
    tiny.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["options.json", "weights.hdf5"]
    again = Elmo.load(tmp_path / "m")
    assert again.config == tiny.config
    np.testing.assert_array_equal(again.embed(["x y"])[0], tiny.embed(["x y"])[0])
    via_files = Elmo.load(options_file=tmp_path / "m" / "options.json", weight_file=tmp_path / "m" / "weights.hdf5")
    np.testing.assert_array_equal(via_files.embed(["x y"])[0], tiny.embed(["x y"])[0])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tiny.save(tmp_path / "m")
    tiny.save(tmp_path / "m", overwrite=True)


@pytest.mark.parametrize("fails_in", ["weights", "options"])
def test_an_interrupted_overwrite_keeps_the_old_pair(tmp_path, monkeypatch, fails_in):
    """Weights and options are renamed into place together, after both are written: a
    failure while writing either leaves the old model loadable, never new weights beside old
    options (which would not load: the shapes disagree)."""
    import elmo_jax.embedding.embedder as embedder_module

    old = Elmo.random("tiny", seed=0)
    old.save(tmp_path / "m")
    (tmp_path / "m" / "notes.txt").write_text("kept")
    other = ElmoConfig.preset("tiny").replace(dim=48)
    new = Elmo.random(other, seed=1)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if fails_in == "weights":
        monkeypatch.setattr(embedder_module, "save_weights", interrupted)
    else:
        monkeypatch.setattr(ElmoConfig, "to_json_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        new.save(tmp_path / "m", overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["notes.txt", "options.json", "weights.hdf5"]
    again = Elmo.load(tmp_path / "m")
    assert again.config == old.config
    np.testing.assert_array_equal(again.embed(["x y"])[0], old.embed(["x y"])[0])
    new.save(tmp_path / "m", overwrite=True)
    assert Elmo.load(tmp_path / "m").config == other


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        Elmo.load(tmp_path / "nope")
    (tmp_path / "m").mkdir()
    with pytest.raises(FileNotFoundError, match="weights.hdf5"):
        Elmo.load(tmp_path / "m")
    Elmo.random("tiny").save(tmp_path / "m2")
    (tmp_path / "m2" / "options.json").unlink()
    with pytest.raises(FileNotFoundError, match="options.json"):
        Elmo.load(tmp_path / "m2")
    with pytest.raises(TypeError, match="list of sentences"):
        Elmo.random("tiny").embed("a single string")
    # A file given for the folder; the two files swapped; options.json that is not UTF-8.
    with pytest.raises(ElmoError, match=r"is a file; Elmo.load takes the model folder \(.*m2\), or options_file="):
        Elmo.load(tmp_path / "m2" / "weights.hdf5")
    Elmo.random("tiny").save(tmp_path / "m3")
    opts, weights = tmp_path / "m3" / "options.json", tmp_path / "m3" / "weights.hdf5"
    with pytest.raises(FileNotFoundError, match="weight file not found"):  # as the docstring says
        Elmo.load(options_file=opts, weight_file=tmp_path / "m3" / "nope.hdf5")
    with pytest.raises(ElmoError, match="HDF5 file, not options.json: were the options and weight files swapped"):
        Elmo.load(options_file=weights, weight_file=opts)
    text = opts.read_text(encoding="utf-8")
    opts.write_bytes(text.encode("utf-16"))
    with pytest.raises(ElmoError, match="is not UTF-8 text .* must be a UTF-8 JSON file"):
        Elmo.load(tmp_path / "m3")
    opts.write_bytes(text.encode("utf-8-sig"))  # a byte-order mark is accepted
    assert Elmo.load(tmp_path / "m3").config == ElmoConfig.preset("tiny")


def test_bucket_ladder():
    # The scan length (time + 2 markers) climbs 8, 12, 16, 24, 32, 48, 64, ...
    assert [scan_length_bucket(n) for n in (1, 8, 9, 12, 13, 17, 25, 33, 49, 65)] == [
        8,
        8,
        12,
        12,
        16,
        24,
        32,
        48,
        64,
        96,
    ]
    assert time_buckets(60) == [6, 10, 14, 22, 30, 46, 62]
    assert time_bucket(1) == 6 and time_bucket(6) == 6 and time_bucket(7) == 10 and time_bucket(62) == 62
    for n in range(1, 300):  # padding never more than a third of the scan
        assert n <= time_bucket(n) and (time_bucket(n) + 2) <= 1.5 * (n + 2) + 1e-9 or time_bucket(n) == 6
    assert row_bucket(3, 64) == 4 and row_bucket(100, 64) == 64 and row_bucket(5, 6) == 6


def test_compiled_shapes_stay_within_documented_bound():
    elmo = Elmo.random("tiny", batch_size=16)
    rng = np.random.default_rng(0)
    words = ["a", "bank", "river", "银行", "x"]
    sents = [list(rng.choice(words, size=int(n))) for n in rng.integers(1, 61, size=500)]
    out = elmo.embed(sents, layers="top")
    assert [v.shape[0] for v in out] == [len(s) for s in sents]
    bound = elmo.max_compiled_shapes(60)
    assert bound == 7 * 5
    assert len(elmo.compiled_shapes) <= bound
    assert {t for _, t in elmo.compiled_shapes} <= set(time_buckets(60))
    assert {r for r, _ in elmo.compiled_shapes} <= {1, 2, 4, 8, 16}
    # A second pass over other random lengths compiles nothing new beyond the bound.
    elmo.embed([["w"] * int(n) for n in rng.integers(1, 61, size=100)], layers="top")
    assert len(elmo.compiled_shapes) <= bound
    # Order and company do not matter: a sentence alone gives the same vectors.
    np.testing.assert_allclose(elmo.embed([sents[7]], layers="top")[0], out[7], atol=1e-6)


def test_layer_modes_and_sentence_vectors(tiny):
    sents = ["the bank of the river", "", ["银行", "取钱"]]
    full = tiny.embed(sents)
    top = tiny.embed(sents, layers="top")
    avg = tiny.embed(sents, layers="average")
    mix_params = {"scalars": np.array([0.5, -1.0, 2.0], np.float32), "gamma": 0.7}
    mix = tiny.embed(sents, layers="mix", mix_params=mix_params)
    w = np.exp(mix_params["scalars"]) / np.exp(mix_params["scalars"]).sum()
    for f, t, a, m in zip(full, top, avg, mix):
        assert t.shape == a.shape == m.shape == f.shape[1:]
        np.testing.assert_array_equal(t, f[-1])
        np.testing.assert_allclose(a, f.mean(0), atol=1e-6)
        np.testing.assert_allclose(m, 0.7 * np.einsum("l,lnd->nd", w, f), atol=1e-5)
    sv = tiny.sentence_vectors(sents)
    assert sv.shape == (3, 64)
    np.testing.assert_allclose(sv[0], avg[0].mean(0), atol=1e-6)
    assert not sv[1].any()
    assert tiny.sentence_vectors(sents, layers="all").shape == (3, 3, 64)
    with pytest.raises(ValueError, match="mix_params"):
        tiny.embed(sents, layers="mix")
    with pytest.raises(ValueError, match="shape"):
        tiny.embed(sents, layers="mix", mix_params={"scalars": np.zeros(2), "gamma": 1.0})
    with pytest.raises(ValueError, match=r'pass result.params\["mix"\]'):
        tiny.embed(sents, layers="mix", mix_params={"mix": mix_params, "classifier": {}})
    with pytest.raises(ValueError, match="mix_params must be a dict"):
        tiny.embed(sents, layers="mix", mix_params=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="layers must be one of"):
        tiny.embed(sents, layers="bottom")


def test_progress_bar_default_threshold(tiny, capsys):
    tiny.embed(["a b"] * 3)
    assert "embed" not in capsys.readouterr().err
    tiny.embed(["a b"] * 3, progress=True)
    assert "embed" in capsys.readouterr().err
    tiny.embed(["a b"] * 1001)
    assert "1001/1001" in capsys.readouterr().err


@pytest.mark.fidelity
def test_token_cache_equals_uncached_and_skips_the_cnn(tmp_path):
    elmo = Elmo.random("tiny", seed=1, batch_size=8)
    sents = ["the bank of the river", "she went to the bank", "unseen words here", "", "银行 取钱 了"]
    plain = elmo.embed(sents)
    vocab = ["<S>", "</S>", "the", "bank", "of", "river", "she", "went", "to", "银行"]
    vectors = elmo.cache_vocabulary(vocab)
    assert vectors.shape == (len(vocab), 32)
    assert_close_across_programs(vectors[3], plain[0][0, 1, :32])  # "bank"
    cached = elmo.embed(sents)
    for a, b in zip(plain, cached):
        assert a.shape == b.shape
        assert_close_across_programs(b, a)
    # Only the uncached words go through the CNN.
    seen = []
    real = elmo._encode_words
    elmo._encode_words = lambda words, n: (seen.append(list(words)), real(words, n))[1]
    again = elmo.embed(sents)
    assert sorted(w for ws in seen for w in ws) == ["here", "unseen", "words", "了", "取钱"]
    seen.clear()
    elmo.embed(["the bank of the river", "银行"])
    assert seen == []
    del elmo._encode_words
    for a, b in zip(cached, again):  # cached words were encoded in another batch (shape)
        assert_close_across_programs(a, b)
    # Save / load round trip of the cache file (one dataset 'embedding').
    elmo.save_token_cache(tmp_path / "cache.hdf5")
    import h5py

    with h5py.File(tmp_path / "cache.hdf5", "r") as f:
        assert list(f.keys()) == ["embedding"] and f["embedding"].shape == (len(vocab), 32)
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    other = Elmo(elmo.config, elmo.params, batch_size=8)
    other.load_token_cache(tmp_path / "cache.hdf5", tmp_path / "vocab.txt")
    for a, b in zip(plain, other.embed(sents)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    with pytest.raises(ElmoError, match="expected"):
        other.load_token_cache(tmp_path / "cache.hdf5", vocab[:-1])
    # The vocabulary file is read as the originals read it: a byte-order mark, surrounding
    # spaces, CRLF and a "!!!MAXTERMID" line do not shift the rows.
    messy = "\ufeff" + "\r\n".join([vocab[0], "!!!MAXTERMID", *(f" {w} " for w in vocab[1:])]) + "\r\n"
    (tmp_path / "messy.txt").write_bytes(messy.encode("utf-8"))
    other.load_token_cache(tmp_path / "cache.hdf5", tmp_path / "messy.txt")
    assert other.token_cache[0] == vocab
    # Files given the wrong way round, or not what they should be, are named.
    with pytest.raises(ElmoError, match="vocab.txt is not a readable HDF5 token cache"):
        other.load_token_cache(tmp_path / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "latin1.txt").write_bytes("the\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(ElmoError, match="latin1.txt, line 2: not valid UTF-8"):
        other.load_token_cache(tmp_path / "cache.hdf5", tmp_path / "latin1.txt")
    other.clear_token_cache()
    assert other.token_cache is None
    # The HDF5 cache given as the vocabulary is named as such, not as a Latin-1 text file.
    with pytest.raises(ElmoError, match="cache.hdf5 is an HDF5 file, not text.*swapped"):
        other.load_token_cache(tmp_path / "vocab.txt", tmp_path / "cache.hdf5")
    for bad in (0, -1):  # -1 used to install an all-zero cache
        with pytest.raises(ValueError, match="batch_size must be >= 1"):
            other.cache_vocabulary(vocab, batch_size=bad)
    assert other.token_cache is None
    # New parameters: the cache belonged to the old ones and is dropped, with a warning.
    other.cache_vocabulary(vocab)
    fresh = Elmo.random("tiny", seed=7, batch_size=8)
    other.params = fresh.params
    with pytest.warns(UserWarning, match="params changed since the token cache was built"):
        moved = other.embed(sents)
    for a, b in zip(fresh.embed(sents), moved):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    assert other.token_cache is None


def test_token_cache_is_bypassed_under_another_matmul_precision(tmp_path):
    """On a GPU/TPU a cache computed under the default (TF32 / bf16-pass) precision must not
    leak into calls made under ``jax.default_matmul_precision("highest")``; a cache read
    from a file is used under any precision (its precision is unknown)."""
    import jax

    elmo = Elmo.random("tiny", seed=2, batch_size=4)
    calls = []
    for name in ("_forward", "_forward_vectors"):
        real = getattr(elmo, name)
        setattr(elmo, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k))[1])
    elmo.cache_vocabulary(["the", "bank"])
    elmo.embed(["the bank"])
    with jax.default_matmul_precision("highest"):
        elmo.embed(["the bank"])
    elmo.embed(["the bank"])
    assert calls == ["_forward_vectors", "_forward", "_forward_vectors"]
    calls.clear()
    elmo.save_token_cache(tmp_path / "c.hdf5")
    elmo.load_token_cache(tmp_path / "c.hdf5", ["the", "bank"])
    with jax.default_matmul_precision("highest"):
        elmo.embed(["the bank"])
    assert calls == ["_forward_vectors"]
    # Built under "highest", it serves "highest" calls and is bypassed by default ones.
    calls.clear()
    with jax.default_matmul_precision("highest"):
        elmo.cache_vocabulary(["the", "bank"])
        elmo.embed(["the bank"])
    elmo.embed(["the bank"])
    assert calls == ["_forward_vectors", "_forward"]


def test_embed_equals_batch_to_ids_forward():
    elmo = Elmo.random(ElmoConfig.preset("tiny"))
    from elmo_jax.model.bilm import bilm

    layers, _ = bilm(elmo.params, elmo.config, batch_to_ids([["p", "q", "r"]]))
    np.testing.assert_allclose(elmo.embed([["p", "q", "r"]])[0], np.asarray(layers[:, 0]), atol=1e-6)


def test_marker_vectors_are_encoded_once_and_follow_new_parameters():
    elmo = Elmo.random("tiny", seed=0, batch_size=4)
    other = Elmo.random("tiny", seed=1, batch_size=4)
    sents = ["the bank of the river", "a b"]
    first = elmo.embed(sents)
    markers = elmo._markers
    elmo.embed(["more text"])
    assert elmo._markers is markers  # not re-encoded for the next call
    # New parameters: the cached <S> / </S> must not leak into their outputs.
    elmo.params = other.params
    for a, b in zip(elmo.embed(sents), other.embed(sents)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert not np.allclose(first[0], elmo.embed(sents)[0], atol=1e-3)


def test_matmul_precision_switch_reaches_every_matmul_of_embed(tiny):
    """README: on GPU/TPU, `with jax.default_matmul_precision("highest")` makes embed full
    float32.  Only the plumbing can be checked on a CPU: every dot and convolution of the
    executable embed compiles under the switch carries that precision."""
    import jax

    sents = [["the", "bank"], ["of", "the", "river"]]
    before = tiny._forward._cache_size()
    default = tiny.embed(sents)
    with jax.default_matmul_precision("highest"):
        highest = tiny.embed(sents)
    assert tiny._forward._cache_size() >= before + 1  # traced again, not reused
    for a, b in zip(default, highest):  # the CPU computes full float32 either way
        np.testing.assert_allclose(a, b, atol=1e-6)
    ids = np.zeros((2, 4, tiny.config.char_cnn.max_characters_per_token), np.int32)
    ids[:] = batch_to_ids([["the", "bank", "of", "x"]] * 2)
    lengths = np.array([4, 3], np.int32)
    markers = tiny._marker_vectors()
    for precision, expected in ((None, False), ("highest", True)):
        with jax.default_matmul_precision(precision):
            text = tiny._forward.lower(tiny.params, tiny.config, ids, None, lengths, markers=markers).as_text()
        ops = [line for line in text.splitlines() if "stablehlo.dot_general" in line or "stablehlo.convolution" in line]
        assert any("convolution" in op for op in ops) and any("dot_general" in op for op in ops)
        assert sum("HIGHEST" in op for op in ops) == expected * len(ops)


def test_bfloat16_option_stays_within_tolerance_of_float32(tiny):
    """``dtype="bfloat16"``: bf16 matmul operands, float32 outputs within 2e-2 (relative to
    the largest value) of the float32 model with the same weights, on every path."""
    sents = ["the bank of the river", "她 去 银行 取钱", "a " * 30]
    low = Elmo(tiny.config, tiny.params, batch_size=8, dtype="bfloat16")
    ref = tiny.embed(sents)
    got = low.embed(sents)
    for a, b in zip(got, ref):
        assert a.dtype == np.float32 and a.shape == b.shape
        err = np.abs(a - b).max() / np.abs(b).max()
        assert 0.0 < err <= 2e-2  # > 0: the bf16 path really ran
    low.cache_vocabulary(["the", "bank", "of"])
    cached = low.embed(sents)
    for a, b in zip(cached, ref):
        assert np.abs(a - b).max() / np.abs(b).max() <= 2e-2


def test_unsupported_dtype_names_the_choices():
    with pytest.raises(ValueError, match="float16.*use one of float32, bfloat16"):
        Elmo.random("tiny", dtype="float16")


@pytest.mark.fidelity
@pytest.mark.parametrize("layers", ["all", "top"])
def test_arrays_over_several_groups_are_contiguous_separate_and_each_sentences_own(tiny, layers):
    """Several groups (batch_size 8), each copied to the host while the next one computes,
    and each group's arrays cut from one buffer: every array must be contiguous, hold
    its own sentence (as embedded alone) and share no memory with its neighbours."""
    words = ["bank", "river", "money", "of", "the", "a", "银行", "it"]
    sents = [[words[(i * 3 + k) % len(words)] for k in range(1 + i % 7)] for i in range(21)]
    out = tiny.embed(sents, layers)
    for i, (s, v) in enumerate(zip(sents, out)):
        assert v.flags["C_CONTIGUOUS"] and v.shape[-2] == len(s)
        assert_close_across_programs(v, tiny.embed([s], layers)[0], err_msg=f"sentence {i}")
    for a, b in zip(out, out[1:]):
        assert not np.shares_memory(a, b)
    before = out[1].copy()
    out[0][...] = 7.0
    np.testing.assert_array_equal(out[1], before)


def test_token_cache_encoder_compiles_stay_within_the_documented_bound():
    """Uncached words are encoded in power-of-two batches of >= 16 tokens: at most
    ``ceil(log2(batch_size * T)) - 3`` encoder shapes in all (``T`` the longest time bucket)."""
    import math

    from elmo_jax.embedding.embedder import time_bucket

    elmo = Elmo.random("tiny", seed=3, batch_size=64)
    elmo.cache_vocabulary(["the"])
    longest = 0
    for n_sentences, n_words in ((1, 5), (3, 6), (3, 7), (16, 8), (64, 8)):
        longest = max(longest, n_words)
        # Every word new, so each group sends n_sentences * n_words words through the CNN.
        out = elmo.embed([[f"w{n_sentences}_{i}_{j}" for j in range(n_words)] for i in range(n_sentences)])
        assert [v.shape[1] for v in out] == [n_words] * n_sentences
    shapes = sorted(n for kind, n, *_ in elmo.compiled_cache_shapes if kind == "encoder")
    assert shapes[0] >= 16 and all(n & (n - 1) == 0 for n in shapes), shapes
    assert len(shapes) <= math.ceil(math.log2(64 * time_bucket(longest))) - 3, (shapes, longest)
    assert shapes == [16, 32, 128, 512]  # 5, 18, 21, 128 and 512 new words
