"""Pictures as PNG files: pure functions, data in, one figure file out.

matplotlib is an optional extra (``pip install -e '.[plot]'``); :func:`require_matplotlib`
names it when it is missing.  Figures are built with ``matplotlib.figure.Figure`` (no
pyplot, no global state, no display needed) and written atomically (a failed write leaves
an earlier picture as it was).

* :func:`curves_png`: one or more curves ``{step: value}`` against steps, with horizontal
  reference lines (held-out perplexity with the generator's optimum; scratch against
  ``init_from``);
* :func:`sense_projection_png`: the occurrences of one ambiguous word, each layer's vectors
  projected to 2-D by :func:`pca_2d`, coloured by sense, one panel per layer;
* :func:`layer_weights_png`: a ScalarMix's normalised layer weights, one group per mix.

:mod:`elmo_jax.run_plots` reads a run's files and calls these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from elmo_jax.atomic import atomic_path
from elmo_jax.errors import ElmoError

INSTALL_HINT = "pip install -e '.[plot]' (or pip install matplotlib)"


class PlottingUnavailable(ElmoError, ImportError):
    """matplotlib is not installed."""


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def require_matplotlib() -> None:
    if not have_matplotlib():
        raise PlottingUnavailable(f"drawing pictures needs matplotlib, which is not installed: {INSTALL_HINT}")


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig, path: str | os.PathLike) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def curves_png(curves: Mapping[str, Mapping[int, float]], path: str | os.PathLike, *,
               references: Mapping[str, float] | None = None, title: str = "",
               ylabel: str = "perplexity", log_y: bool = True,
               styles: Mapping[str, str] | None = None) -> str:
    """Curves ``{label: {step: value}}`` against steps, and horizontal ``references``
    ``{label: value}`` (dashed), written to ``path``; returns ``path``.  ``styles``: a
    matplotlib format string per curve label (default: lines with markers)."""
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        raise ElmoError(f"nothing to draw for {path}: no values")
    fig = _figure(7.0, 4.2)
    ax = fig.add_subplot()
    for label, values in curves.items():
        steps = sorted(values)
        ys = [values[s] for s in steps]
        ax.plot(steps, ys, (styles or {}).get(label, "o-"), label=label, markersize=4, linewidth=1.6)
    colours = ("tab:green", "tab:gray", "tab:purple", "tab:brown")
    for (label, value), colour in zip((references or {}).items(), colours):
        ax.axhline(value, linestyle="--", linewidth=1.2, color=colour, label=f"{label} ({value:.2f})")
    if log_y:
        ax.set_yscale("log")
        _readable_log_ticks(ax)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    return _save(fig, path)


def _readable_log_ticks(ax) -> None:
    """Plain numbers (20, 30, 50, 100, ...) on a log axis instead of powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=np.arange(1, 10)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def pca_2d(x_ND: np.ndarray) -> np.ndarray:
    """The rows of ``x_ND`` projected on their first two principal axes: ``[N, 2]``
    (numpy SVD of the centred rows; a second axis of zeros when there is only one)."""
    x = np.asarray(x_ND, np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"pca_2d needs [N >= 2, D] rows, got shape {x.shape}")
    x = x - x.mean(axis=0, keepdims=True)
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    out = u[:, :2] * s[:2]
    if out.shape[1] < 2:
        out = np.concatenate([out, np.zeros((len(x), 2 - out.shape[1]))], axis=1)
    return out


def sense_projection_png(layers: Mapping[str, np.ndarray], senses: Sequence[str], path: str | os.PathLike, *,
                         word: str, title: str = "") -> str:
    """One panel per layer: ``layers[name]`` (``[N, D]``, the word's N occurrences)
    projected by :func:`pca_2d`, each point coloured by ``senses[i]``; returns ``path``."""
    if not layers:
        raise ElmoError(f"nothing to draw for {path}: no layers")
    n = len(senses)
    for name, x in layers.items():
        if len(x) != n:
            raise ValueError(f"layer {name!r} has {len(x)} rows for {n} senses")
    names = sorted(set(senses))
    fig = _figure(3.6 * len(layers), 3.9)
    axes = fig.subplots(1, len(layers), squeeze=False)[0]
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    sense_arr = np.asarray(senses)
    for ax, (name, x) in zip(axes, layers.items()):
        xy = pca_2d(x)
        for sense, colour in zip(names, colours):
            pick = sense_arr == sense
            ax.scatter(xy[pick, 0], xy[pick, 1], s=12, alpha=0.7, color=colour, label=sense)
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].legend(title=f"sense of '{word}'", fontsize=8, title_fontsize=8, loc="best")
    fig.suptitle(title or f"'{word}': {n} occurrences, 2-D PCA of each layer's vectors", fontsize=11)
    return _save(fig, path)


def layer_weights_png(weights: Mapping[str, Sequence[float]], path: str | os.PathLike, *, title: str = "") -> str:
    """Bars of each mix's normalised layer weights (``{label: [w_0, ..., w_L]}``, e.g.
    ``softmax(mix["w"])``); returns ``path``."""
    if not weights:
        raise ElmoError(f"nothing to draw for {path}: no weights")
    n_layers = {len(w) for w in weights.values()}
    if len(n_layers) != 1:
        raise ValueError(f"the mixes have different layer counts: {sorted(n_layers)}")
    n = n_layers.pop()
    fig = _figure(max(4.0, 1.6 + 1.2 * n), 3.6)
    ax = fig.add_subplot()
    width = 0.8 / len(weights)
    for k, (label, w) in enumerate(weights.items()):
        xs = np.arange(n) + (k - (len(weights) - 1) / 2) * width
        ax.bar(xs, np.asarray(w, np.float64), width=width, label=label)
    ax.set_xticks(np.arange(n), [("layer 0 (char CNN)" if i == 0 else f"layer {i}") for i in range(n)])
    ax.set_ylabel("weight (softmax of the mix's parameters)")
    ax.axhline(1.0 / n, linestyle="--", linewidth=1, color="tab:gray", label="equal weights")
    ax.set_title(title or "trained ScalarMix: layer weights")
    ax.legend(fontsize=8)
    return _save(fig, path)


__all__ = ["INSTALL_HINT", "PlottingUnavailable", "curves_png", "have_matplotlib", "layer_weights_png", "pca_2d",
           "require_matplotlib", "sense_projection_png"]
