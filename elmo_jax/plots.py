"""Pictures as PNG files: pure functions, data in, one figure file out.

matplotlib is an optional extra (``pip install -e '.[plot]'``); :func:`require_matplotlib`
names it when it is missing.  Figures are built with ``matplotlib.figure.Figure`` (no
pyplot, no global state, no display needed) and written atomically (a failed write leaves
an earlier picture as it was).

* :func:`curves_png`: one or more curves ``{step: value}`` against steps, with horizontal
  reference lines (held-out perplexity with the generator's optimum; scratch against
  ``init_from``);
* :func:`sense_projection_png`: the occurrences of one ambiguous word, each layer's vectors
  projected to 2-D (:func:`fisher_2d`: a sense direction fitted on other occurrences, and
  :func:`pca_2d` of the rest), coloured by sense, one panel per layer; points on one spot
  (:func:`stacks`: every occurrence in the context-free layer 0) are drawn as rings, one
  per sense, with their counts;
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


def curves_png(
    curves: Mapping[str, Mapping[int, float]],
    path: str | os.PathLike,
    *,
    references: Mapping[str, float] | None = None,
    title: str = "",
    ylabel: str = "perplexity",
    log_y: bool = True,
    styles: Mapping[str, str] | None = None,
) -> str:
    """Curves ``{label: {step: value}}`` against steps, and horizontal ``references``
    ``{label: value}`` (dashed; a label holding ``{value}``, e.g. ``"optimum {value:.2f}: ..."``,
    places the value itself, else `` (value)`` follows it), written to ``path``; returns
    ``path``.  ``styles``: a
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
        text = label.format(value=value) if "{value" in label else f"{label} ({value:.2f})"
        ax.axhline(value, linestyle="--", linewidth=1.2, color=colour, label=text)
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
    # matplotlib's stub wants a Sequence for subs; LogLocator takes any array (np.asarray)
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=np.arange(1, 10)))  # type: ignore[arg-type]
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


def fisher_2d(x_fit_ND: np.ndarray, senses_fit: Sequence[str], x_ND: np.ndarray, shrink: float = 0.01) -> np.ndarray:
    """``x_ND`` in 2-D: along the discriminant direction between the two most frequent senses
    of ``senses_fit``, fitted on ``x_fit_ND`` only (Fisher's, with the within-sense covariance
    shrunk by ``shrink`` of its mean variance), and along the first principal axis of what
    remains of ``x_ND``.  Fitting on other occurrences than those drawn keeps the picture
    honest: a direction fitted on the drawn points would separate them even for random vectors."""
    x_fit = np.asarray(x_fit_ND, np.float64)
    x = np.asarray(x_ND, np.float64)
    labels = np.asarray(senses_fit)
    names, counts = np.unique(labels, return_counts=True)
    if len(names) < 2:
        raise ValueError(f"fisher_2d needs occurrences of two senses to fit on, got {list(names)}")
    a, b = names[np.argsort(-counts)[:2]]
    mean_a, mean_b = x_fit[labels == a].mean(axis=0), x_fit[labels == b].mean(axis=0)
    pairs = np.isin(labels, (a, b))
    centred = x_fit[pairs] - np.where((labels[pairs] == a)[:, None], mean_a, mean_b)
    within = centred.T @ centred / max(len(centred), 1)
    ridge = shrink * np.trace(within) / len(within) + 1e-9
    w = np.linalg.solve(within + ridge * np.eye(len(within)), mean_a - mean_b)
    w /= max(np.linalg.norm(w), 1e-12)
    along = (x - (mean_a + mean_b) / 2) @ w
    rest = x - along[:, None] * w[None, :]
    return np.stack([along, pca_2d(rest)[:, 0] if len(x) >= 2 else np.zeros(len(x))], axis=1)


def sense_projection_png(
    points: Mapping[str, np.ndarray],
    senses: Sequence[str],
    path: str | os.PathLike,
    *,
    word: str,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
) -> str:
    """One panel per layer: ``points[name]`` (``[N, 2]``, the word's N occurrences, e.g. from
    :func:`fisher_2d` or :func:`pca_2d`), each point coloured by ``senses[i]``; returns ``path``."""
    if not points:
        raise ElmoError(f"nothing to draw for {path}: no layers")
    n = len(senses)
    for name, xy in points.items():
        if np.shape(xy) != (n, 2):
            raise ValueError(f"layer {name!r} has points of shape {np.shape(xy)} for {n} senses (want [{n}, 2])")
    names = sorted(set(senses))
    fig = _figure(3.6 * len(points), 3.9)
    axes = fig.subplots(1, len(points), squeeze=False)[0]
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    sense_arr = np.asarray(senses)
    for ax, (name, xy) in zip(axes, points.items()):
        xy = np.asarray(xy)
        stacked_at, stack_of = stacks(xy)
        alone = stack_of < 0
        for sense, colour in zip(names, colours):
            pick = (sense_arr == sense) & alone
            ax.scatter(xy[pick, 0], xy[pick, 1], s=12, alpha=0.7, color=colour)
        _draw_stacks(ax, xy, sense_arr, stacked_at, stack_of, names, colours)
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="o", linestyle="", color=colour, markersize=5, alpha=0.7, label=sense)
        for sense, colour in zip(names, colours)
    ]  # one entry per sense, however its points were drawn
    axes[0].legend(handles=handles, title=f"sense of '{word}'", fontsize=8, title_fontsize=8, loc="best")
    fig.suptitle(title or f"'{word}': {n} occurrences per layer", fontsize=11)
    return _save(fig, path)


def stacks(xy_N2: np.ndarray, tolerance: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """Points drawn on one spot: ``(spots [S, 2], stack_of [N])``, where ``stack_of[i]`` is the
    spot of point ``i`` when a chain of other points leads to it, each within ``tolerance`` of
    the panel's extent (and never less than float noise on the coordinates' own scale);
    ``-1``: alone.  Spots are ordered by size, largest first.  A context-free layer (the char
    CNN) gives every occurrence of a word one vector, so all its points are one stack."""
    xy = np.asarray(xy_N2, np.float64)
    n = len(xy)
    stack_of = np.full(n, -1)
    if n < 2:
        return np.zeros((0, 2)), stack_of
    reach = max(tolerance * float(np.ptp(xy, axis=0).max()), 1e-5 * float(np.abs(xy).max()), 1e-12)
    near = np.zeros((n, n), bool)
    for i in range(0, n, 512):  # [512, N] blocks: bounded memory for long lists
        near[i : i + 512] = np.abs(xy[i : i + 512, None, :] - xy[None, :, :]).max(axis=-1) <= reach
    group = np.arange(n)
    while True:  # each point takes the smallest index it reaches: connected groups
        spread = np.where(near, group[None, :], n).min(axis=1)
        if np.array_equal(spread, group):
            break
        group = spread
    ids, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
    order = [k for k in np.argsort(-counts, kind="stable") if counts[k] > 1]
    for rank, k in enumerate(order):
        stack_of[inverse.reshape(-1) == k] = rank
    spots = np.array([xy[stack_of == rank].mean(axis=0) for rank in range(len(order))]).reshape(-1, 2)
    return spots, stack_of


def _draw_stacks(ax, xy, senses, spots, stack_of, names, colours, labelled: int = 2, share: float = 0.05) -> None:
    """Each stack as concentric discs, one per sense present (the largest drawn first, so none
    hides another); the ``labelled`` largest stacks that mix senses and hold at least ``share``
    of the points say their count per sense (small ones would only clutter the panel)."""
    n_labels = 0
    for k, (x, y) in enumerate(spots):
        members = senses[stack_of == k]
        present = [(sense, colour) for sense, colour in zip(names, colours) if np.any(members == sense)]
        for rank, (_, colour) in enumerate(present):
            size = 36.0 * (len(present) - rank) ** 2
            ax.scatter([x], [y], s=size, color=colour, edgecolors="white", linewidths=0.8, zorder=3 + rank)
        if n_labels < labelled and len(present) > 1 and len(members) >= share * len(senses):
            n_labels += 1
            counts = ", ".join(f"{int(np.sum(members == sense))} {sense}" for sense, _ in present)
            every = "all " if len(members) == len(senses) else ""
            ax.annotate(
                f"{every}{len(members)} on one spot: {counts}",
                (x, y),
                xytext=(0, -8 - 4 * len(present)),
                textcoords="offset points",
                ha="center",
                va="top",
                fontsize=7,
                zorder=10,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
            )


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


__all__ = [
    "INSTALL_HINT",
    "PlottingUnavailable",
    "curves_png",
    "fisher_2d",
    "have_matplotlib",
    "layer_weights_png",
    "pca_2d",
    "require_matplotlib",
    "sense_projection_png",
    "stacks",
]
