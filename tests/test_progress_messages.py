"""What a command says while and after it works: rates with the digits that matter, refusals
before the slow loading, and news of each picture as it is drawn."""

import json

import pytest

from elmo_jax.cli import main


def test_rates_keep_their_digits_at_any_size():
    from elmo_jax.rates import rate_text

    assert rate_text(12, 28.6) == "0.420"
    assert rate_text(1, 3e6) == "0.000000333"
    assert rate_text(45.678, 1) == "45.7" and rate_text(457.2, 1) == "457"
    assert rate_text(123456, 2) == "61,728" and rate_text(0, 5) == "0"


def test_embed_reports_the_rate_of_a_few_tokens_in_a_long_run(tmp_path, monkeypatch, capsys):
    """12 tokens in 28.6 s is 0.420 tokens/s, not "0 tokens/s"."""
    from elmo_jax import embed_file as embed_file_module
    from elmo_jax.embedding.embedder import Elmo

    src = tmp_path / "in.txt"
    src.write_text("a b c\n" * 4, encoding="utf-8")
    monkeypatch.setattr(Elmo, "random", staticmethod(lambda *a, **k: object()))
    monkeypatch.setattr(
        embed_file_module,
        "embed_file",
        lambda *a, **k: {
            "sentences": 4,
            "tokens": 12,
            "seconds": 28.6,
            "devices": 1,
            "hosts": 1,
            "resumed_from": None,
            "output": str(tmp_path / "out.hdf5"),
        },
    )
    assert main(["embed", str(src), str(tmp_path / "out.hdf5"), "--top", "--preset", "tiny", "--no-progress"]) == 0
    assert "(12 tokens, " in (out := capsys.readouterr().out) and "in 28.6 s: 0.420 tokens/s" in out, out


@pytest.mark.parametrize("case", ["output exists", "no input", "no output folder"])
def test_embed_refuses_what_it_can_before_loading_the_model(tmp_path, monkeypatch, capsys, case):
    from elmo_jax.embedding.embedder import Elmo

    def load(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(Elmo, "random", staticmethod(load))
    monkeypatch.setattr(Elmo, "load", staticmethod(load))
    src, out = tmp_path / "in.txt", tmp_path / "out.hdf5"
    src.write_text("a b\n", encoding="utf-8")
    out.write_bytes(b"earlier output")
    expected = f"{out} exists; pass --overwrite"
    if case == "no input":
        src.unlink()
        expected = f"input file not found: {src}"
    elif case == "no output folder":
        out = tmp_path / "missing" / "out.hdf5"
        expected = f"output folder does not exist: {out.parent}"
    for model in (["--preset", "tiny"], ["--model", str(tmp_path)]):
        assert main(["embed", str(src), str(out), "--top", "--no-progress", *model]) == 2
        assert expected in capsys.readouterr().err
    assert (tmp_path / "out.hdf5").read_bytes() == b"earlier output"


def test_plot_says_each_picture_when_written_and_the_slow_work_before_it(tmp_path, monkeypatch, capsys):
    """The perplexity picture is announced at once, not after the word-sense picture's minutes
    of checkpoint loading and embedding, which are announced too."""
    pytest.importorskip("matplotlib")
    from elmo_jax import run_plots

    run = tmp_path / "run"
    (run / "corpus").mkdir(parents=True)
    (run / "corpus" / "stats.json").write_text("{}", encoding="utf-8")
    records = [{"step": s, "kind": "train", "time": 0.0, "loss": 5.0, "perplexity": 150.0} for s in (50, 100)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    monkeypatch.setattr(run_plots, "corpus_references", lambda *a: {})
    said = {}

    def newest(workdir):
        said["before the checkpoint"] = capsys.readouterr().out
        return {"bilm": None}, None

    def senses(workdir, corpus_dir, params, model_config, **kw):
        (kw.get("say") or print)("word senses: embedding")
        said["before the word senses"] = capsys.readouterr().out
        return str(run / "word_senses.png")

    monkeypatch.setattr(run_plots, "_newest_params", newest)
    monkeypatch.setattr(run_plots, "plot_word_senses", senses)
    assert main(["plot", str(run)]) == 0
    assert f"wrote {run / 'perplexity.png'}" in said["before the checkpoint"], said
    assert "word senses: reading the newest checkpoint" in said["before the checkpoint"], said
    assert f"wrote {run / 'word_senses.png'}" in capsys.readouterr().out
