"""elmo_jax.plots and elmo_jax.run_plots: PNGs from a run's own files (Agg, no display)."""

import json

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install -e '.[test]' (or '.[plot]')")

from elmo_jax import plots  # noqa: E402
from elmo_jax.errors import ElmoError  # noqa: E402


def _png_shape(path):
    from matplotlib.image import imread

    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return imread(path).shape


def _fake_run(folder, *, with_eval=True):
    folder.mkdir()
    records = [
        {"step": s, "kind": "train", "time": 0.0, "loss": 5.0 - s / 100, "perplexity": float(np.exp(5.0 - s / 100))}
        for s in (50, 100, 150, 200)
    ]
    if with_eval:
        records += [
            {
                "step": s,
                "kind": "eval",
                "time": 0.0,
                "perplexity": p,
                "fwd_perplexity": p,
                "bwd_perplexity": p,
                "tokens": 10,
            }
            for s, p in ((100, 80.0), (200, 45.0))
        ]
    text = "\n".join(json.dumps(r) for r in records) + "\n" + '{"step": 250, "kind": "tra'  # a line cut by a crash
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    return folder


def test_pca_2d_finds_the_axes_of_largest_variance():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(200, 2)) * np.array([10.0, 1.0])  # variance 100 along x, 1 along y
    rotation, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    x = np.concatenate([base, 0.01 * rng.normal(size=(200, 3))], axis=1) @ rotation + 3.0
    xy = plots.pca_2d(x)
    assert xy.shape == (200, 2)
    np.testing.assert_allclose(xy.mean(axis=0), 0.0, atol=1e-9)
    # Up to sign, the projection recovers the two planted coordinates.
    centred = base - base.mean(axis=0)
    for k in range(2):
        corr = abs(np.corrcoef(xy[:, k], centred[:, k])[0, 1])
        assert corr > 0.99  # (the sample axes are not exactly uncorrelated)
    with pytest.raises(ValueError, match="N >= 2"):
        plots.pca_2d(np.zeros((1, 4)))


def test_plot_run_draws_perplexity_from_metrics(tmp_path):
    from elmo_jax.run_plots import plot_run, read_metrics

    run = _fake_run(tmp_path / "run")
    metrics = read_metrics(run)
    assert sorted(metrics["eval"]) == [100, 200] and sorted(metrics["train"]) == [50, 100, 150, 200]
    written = plot_run(run)
    assert written == [str(run / "perplexity.png")]
    h, w, _ = _png_shape(written[0])
    assert (h, w) == (462, 770)  # 7 x 4.2 inches at 110 dpi
    # Nothing to draw: a clear error naming the command that scores a checkpoint.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.jsonl").write_text(json.dumps({"step": 5, "kind": "train", "loss": 9.0}) + "\n")
    with pytest.raises(ElmoError, match="elmo-jax eval"):
        plot_run(bare)
    with pytest.raises(ElmoError, match="has no metrics.jsonl"):
        plot_run(tmp_path)


def test_fisher_2d_finds_a_low_variance_sense_direction_pca_misses():
    rng = np.random.default_rng(2)

    def draw(n):
        senses = np.array(["money", "river"] * (n // 2))
        x = rng.normal(size=(n, 6)) * np.array([20.0, 20.0, 1.0, 1.0, 1.0, 1.0])  # loud, senseless axes
        x[:, 4] += np.where(senses == "money", 2.0, -2.0)  # the sense, on a quiet axis
        return x, senses

    x_fit, s_fit = draw(200)
    x, senses = draw(100)
    xy = plots.fisher_2d(x_fit, list(s_fit), x)
    assert xy.shape == (100, 2)
    assert np.mean((xy[:, 0] > 0) == (senses == "money")) > 0.95  # the first axis separates the senses
    pca = plots.pca_2d(x)
    assert max(abs(np.corrcoef(pca[:, k], senses == "money")[0, 1]) for k in range(2)) < 0.5  # PCA does not
    with pytest.raises(ValueError, match="two senses"):
        plots.fisher_2d(x_fit, ["money"] * 200, x)


def test_sense_projection_and_layer_weights(tmp_path):
    rng = np.random.default_rng(1)
    senses = ["money"] * 30 + ["river"] * 30
    points = {"layer 0 (char CNN)": np.zeros((60, 2)), "layer 1": rng.normal(size=(60, 2))}
    path = plots.sense_projection_png(points, senses, tmp_path / "senses.png", word="bank")
    assert _png_shape(path)[:2] == (429, 792)  # 2 panels of 3.6 x 3.9 inches
    with pytest.raises(ValueError, match=r"shape \(59, 2\) for 60 senses"):
        plots.sense_projection_png({"x": np.zeros((59, 2))}, senses, tmp_path / "bad.png", word="bank")
    assert not (tmp_path / "bad.png").exists()
    path = plots.layer_weights_png({"ScalarMix": [0.2, 0.5, 0.3]}, tmp_path / "mix.png")
    assert _png_shape(path)[0] == 396


def _capture_figures(monkeypatch) -> list:
    """The figures plots writes, kept for a look at what they show."""
    figures, save = [], plots._save

    def keep(fig, path):
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def _pixels_of(fig, ax, rgb, skip=()) -> int:
    """Pixels inside ``ax`` (less the boxes of the artists in ``skip``) within 40 of ``rgb``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    height = image.shape[0]
    inside = np.zeros(image.shape[:2], bool)

    def box(artist):
        b = artist.get_window_extent()
        return slice(int(height - b.y1), int(height - b.y0) + 1), slice(int(b.x0), int(b.x1) + 1)

    inside[box(ax)] = True
    for artist in skip:
        inside[box(artist)] = False
    return int(np.sum(inside & (np.abs(image - np.asarray(rgb)).max(axis=-1) <= 40)))


def test_points_on_one_spot_stay_visible_with_their_counts(tmp_path, monkeypatch):
    """Layer 0 is context-free: every occurrence of the word is one point; the first sense's
    points must not vanish under the second's."""
    figures = _capture_figures(monkeypatch)
    rng = np.random.default_rng(0)
    senses = ["money"] * 30 + ["river"] * 30
    spot = np.tile([[0.8, -0.3]], (60, 1))
    plots.sense_projection_png(
        {"layer 0 (char CNN)": spot, "layer 1": rng.normal(size=(60, 2))}, senses, tmp_path / "senses.png", word="bank"
    )
    fig = figures[-1]
    layer0 = fig.axes[0]
    money_blue = (31, 119, 180)  # tab:blue
    assert _pixels_of(fig, layer0, money_blue, skip=[layer0.get_legend()]) > 20
    assert any("30 money, 30 river" in t.get_text() for t in layer0.texts)
    spots, stack_of = plots.stacks(spot + 1e-8 * rng.normal(size=(60, 2)))  # float noise is one spot too
    assert len(spots) == 1 and set(stack_of) == {0}
    apart = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [2.0, 0.5]])
    assert list(plots.stacks(apart)[1]) == [-1, 0, 0, -1]


def test_the_optimum_line_says_it_bounds_held_out_text_only(tmp_path, monkeypatch):
    """Training batches (seen text) may go below the generator's optimum; the legend says why."""
    from elmo_jax.data.synthetic_corpus import write_corpus
    from elmo_jax.run_plots import plot_run

    figures = _capture_figures(monkeypatch)
    run = _fake_run(tmp_path / "run")
    write_corpus(run / "corpus", n_train=10, n_heldout=5)
    plot_run(run)
    legend = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    optimum = next(t for t in legend if "optimum" in t)
    assert "held-out text only" in optimum and "training batches" in optimum and "can go below" in optimum


def test_word_senses_of_a_synthetic_run(tmp_path):
    import jax

    from elmo_jax.config import ElmoConfig
    from elmo_jax.model.bilm import init_params
    from elmo_jax.run_plots import plot_word_senses

    # A held-out split in the embedded corpus's format: "bank" (6 times) is the most frequent
    # ambiguous word, "bat" (once) is not drawn.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    sentences = [
        ("she sat on the bank", "river"),
        ("the bank lent money", "money"),
        ("a bat flew", None),
        ("the river bank", "river"),
        ("my bank account", "money"),
        ("bank bank", "money"),
    ]
    lines, labels = [], []
    for text, sense in sentences:
        words = text.split()
        word = "bat" if "bat" in words else "bank"
        labels.append(
            {
                "classes": ["X"] * len(words),
                "senses": [f"{word}#{sense or 'animal'}" if w == word else "-" for w in words],
            }
        )
        lines.append(text)
    for split in ("heldout", "train"):  # (the sense direction is fitted on the training occurrences)
        (corpus / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (corpus / f"{split}.labels.jsonl").write_text("\n".join(json.dumps(lab) for lab in labels) + "\n")
    config = ElmoConfig.preset("tiny").replace(
        dim=16, projection_dim=8, embedding_dim=4, filters=[[1, 8], [2, 8]], n_highway=1
    )
    path = plot_word_senses(str(tmp_path), str(corpus), init_params(jax.random.key(0), config), config)
    assert path == str(tmp_path / "word_senses.png") and _png_shape(path)[1] == 3 * 396  # 3 panels (layers 0-2)


def test_cli_plot_and_missing_matplotlib(tmp_path, monkeypatch, capsys):
    from elmo_jax.cli import main

    run = _fake_run(tmp_path / "run", with_eval=False)
    assert main(["plot", str(run)]) == 0
    assert f"wrote {run / 'perplexity.png'}" in capsys.readouterr().out
    monkeypatch.setattr(plots, "have_matplotlib", lambda: False)
    assert main(["plot", str(run)]) == 2
    assert "pip install -e '.[plot]'" in capsys.readouterr().err


def test_domain_adaptation_example_draws_its_curves(tmp_path, capsys):
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("domain_adaptation", REPO / "examples" / "domain_adaptation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.picture(str(tmp_path), {0: 49.7, 50: 33.8, 100: 31.6}, {50: 265.4, 100: 174.8, 150: 102.3}, 20.9)
    assert f"wrote {tmp_path / 'domain_adaptation.png'}" in capsys.readouterr().out
    assert _png_shape(tmp_path / "domain_adaptation.png")[:2] == (462, 770)
