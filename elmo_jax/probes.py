"""Probes of contextual vectors: word-sense 1-nearest-neighbour and a word-class linear probe.

They read what an embedder returns (``Elmo.embed`` or anything with the same layout): for
each sentence an array ``[L+1, n_tokens, 2P]`` where layer 0 is the token layer duplicated
``[e; e]`` and layers ``1..L`` are ``[forward_l ; backward_l]`` (forward half ``[..., :P]``,
backward half ``[..., P:]``).  Nothing here imports the model.

Labels are one dict per sentence with lists aligned to the tokens, as
:func:`elmo_jax.data.synthetic_corpus.load_corpus` returns them:

* ``classes``: the gold word class of every token;
* ``senses``: ``"word#sense"`` for polysemous tokens, ``"-"`` otherwise;
* ``resolved_by`` (optional): ``"left"`` / ``"right"`` / ``"both"`` for polysemous tokens, the
  side of the context that decides the sense.

Both probes use one deterministic split of the *sentences* (``test_fraction`` of them, chosen
by a permutation from ``numpy.random.default_rng(seed)``), so no test vector shares a sentence
with a training vector.

* Word sense (ELMo paper, section 5.3): each test occurrence of a polysemous word takes the
  sense of its most cosine-similar training occurrence *of the same word*.  Baseline: the
  word's most frequent training sense.
* Word class: multinomial logistic regression on standardised vectors (full-batch Adam, L2),
  accuracy on the test tokens.  Baselines: the most frequent class overall and, when the
  sentences are given, each word form's most frequent training class.

:func:`probe_table` evaluates layer 0, every LSTM layer in full and its forward-only and
backward-only halves; :func:`format_probe_table` renders the rows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from elmo_jax.data.synthetic import NO_SENSE

__all__ = [
    "format_probe_table",
    "logistic_regression_probe",
    "probe_table",
    "split_sentences",
    "wsd_nearest_neighbour",
]

SIDES = ("left", "right", "both")


def split_sentences(n: int, test_fraction: float = 0.5, seed: int = 0) -> np.ndarray:
    """Boolean mask ``[n]``: which sentences are test sentences (deterministic in ``seed``)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    is_test = np.zeros(n, dtype=bool)
    is_test[perm[: int(round(n * test_fraction))]] = True
    return is_test


# Cosine similarities closer than this to a row's best are a tie (float32 rounding of a
# unit-vector dot product is ~1e-7).
TIE_TOLERANCE = 1e-5


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def wsd_nearest_neighbour(
    vectors: np.ndarray, senses: Sequence[str], is_test: np.ndarray, sides: Sequence[str] | None = None
) -> dict[str, Any]:
    """1-nearest-neighbour word-sense disambiguation (cosine, same word only).

    Args:
      vectors: ``[N, D]``, one row per occurrence of a polysemous word.
      senses: ``"word#sense"`` per row.
      is_test: ``[N]`` bool, test rows; the rest are the neighbours to search.
      sides: optional resolving side per row, for the per-side accuracies.
    Returns:
      ``{"acc", "majority", "n_test", "acc_<side>", "majority_<side>", "n_<side>"}``;
      accuracies are ``nan`` where there is no test row.  A test word without any training
      occurrence counts as wrong for both the probe and the baseline.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    senses = list(senses)
    is_test = np.asarray(is_test, dtype=bool)
    if vectors.ndim != 2 or len(vectors) != len(senses) or len(is_test) != len(senses):
        raise ValueError("vectors [N, D], senses [N] and is_test [N] must agree")
    words = [s.split("#", 1)[0] for s in senses]
    by_word: dict[str, list[int]] = defaultdict(list)
    for i, w in enumerate(words):
        by_word[w].append(i)
    pred = np.zeros(len(senses), dtype=bool)  # probe correct
    base = np.zeros(len(senses), dtype=bool)  # majority baseline correct
    unit = _unit(vectors)
    for w in sorted(by_word):
        rows = np.asarray(by_word[w])
        tr, te = rows[~is_test[rows]], rows[is_test[rows]]
        if len(te) == 0 or len(tr) == 0:
            continue
        sims = unit[te] @ unit[tr].T
        # Ties go to the first training row: equal vectors (every occurrence of a word in a
        # context-free layer) have similarities that differ only by the matmul's rounding,
        # which moves with the CPU's vector code, so an exact argmax would pick by noise.
        near_best = sims >= sims.max(axis=1, keepdims=True) - TIE_TOLERANCE
        nearest = tr[np.argmax(near_best, axis=1)]
        pred[te] = [senses[j] == senses[i] for i, j in zip(te, nearest)]
        counts = Counter(senses[j] for j in tr)
        majority = min(counts, key=lambda s: (-counts[s], s))
        base[te] = [senses[i] == majority for i in te]

    def acc(mask: np.ndarray, hits: np.ndarray) -> float:
        return float(hits[mask].mean()) if mask.any() else float("nan")

    out: dict[str, Any] = {"acc": acc(is_test, pred), "majority": acc(is_test, base), "n_test": int(is_test.sum())}
    if sides is not None:
        sides_arr = np.asarray(list(sides))
        for side in SIDES:
            m = is_test & (sides_arr == side)
            out[f"acc_{side}"] = acc(m, pred)
            out[f"majority_{side}"] = acc(m, base)
            out[f"n_{side}"] = int(m.sum())
    return out


def logistic_regression_probe(
    x_train: np.ndarray,
    y_train: Sequence[Any],
    x_test: np.ndarray,
    y_test: Sequence[Any],
    steps: int = 300,
    lr: float = 0.05,
    l2: float = 1e-4,
    per_token: bool = False,
):
    """Test accuracy of a multinomial logistic regression trained on ``(x_train, y_train)``.

    Features are standardised with the training mean and deviation; training is full-batch
    Adam on the mean cross-entropy plus ``l2 * |W|^2``.  Classes unseen in training are
    always wrong.  With ``per_token`` it returns the boolean ``[n_test]`` correctness instead.
    """
    x_train = np.asarray(x_train, dtype=np.float32)
    x_test = np.asarray(x_test, dtype=np.float32)
    classes = sorted(set(y_train))
    if not classes or len(x_test) == 0:
        return np.zeros(len(x_test), dtype=bool) if per_token else float("nan")
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[c] for c in y_train])
    mean = x_train.mean(0)
    std = x_train.std(0) + 1e-6
    xs = (x_train - mean) / std
    n, d = xs.shape
    k = len(classes)
    w = np.zeros((d, k), dtype=np.float32)
    b = np.zeros(k, dtype=np.float32)
    onehot = np.zeros((n, k), dtype=np.float32)
    onehot[np.arange(n), y] = 1.0
    m = [np.zeros_like(w), np.zeros_like(b)]
    v = [np.zeros_like(w), np.zeros_like(b)]
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(1, steps + 1):
        logits = xs @ w + b
        logits -= logits.max(1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / n
        grads = [xs.T @ g + 2 * l2 * w, g.sum(0)]
        for j, (param, grad) in enumerate(zip((w, b), grads)):
            m[j] = b1 * m[j] + (1 - b1) * grad
            v[j] = b2 * v[j] + (1 - b2) * grad * grad
            param -= lr * (m[j] / (1 - b1**t)) / (np.sqrt(v[j] / (1 - b2**t)) + eps)
    pred = np.argmax(((x_test - mean) / std) @ w + b, axis=1)
    truth = np.array([index.get(c, -1) for c in y_test])
    return (pred == truth) if per_token else float((pred == truth).mean())


def _views(n_layers: int, width: int) -> list[tuple[str, int, slice]]:
    if width % 2:
        raise ValueError(f"the last axis (2P) must be even, got {width}")
    half = width // 2
    views = [("layer 0", 0, slice(0, half))]  # [e; e]: one copy is the whole information
    for layer in range(1, n_layers):
        views += [
            (f"layer {layer}", layer, slice(0, width)),
            (f"layer {layer} fwd", layer, slice(0, half)),
            (f"layer {layer} bwd", layer, slice(half, width)),
        ]
    return views


def probe_table(
    embeddings: Sequence[np.ndarray],
    labels: Sequence[Mapping[str, Any]],
    *,
    sentences: Sequence[Sequence[str]] | None = None,
    sides: Mapping[str, str] | None = None,
    test_fraction: float = 0.5,
    seed: int = 0,
    max_class_train: int = 20_000,
    class_steps: int = 300,
    is_test: Sequence[bool] | None = None,
    token_subsets: Mapping[str, Sequence[bool]] | None = None,
) -> list[dict[str, Any]]:
    """Runs both probes on every view of the layers; returns one dict per row.

    Args:
      embeddings: per sentence ``[L+1, n_tokens, 2P]`` (numpy or anything ``np.asarray``
        takes), as ``Elmo.embed`` returns.
      labels: per sentence ``{"classes": [...], "senses": [...], "resolved_by": [...]?}``.
      sentences: optional tokens; enables the per-word-majority word-class baseline.
      sides: optional ``{word: "left"|"right"|"both"}``, used when labels lack
        ``resolved_by``.
      test_fraction, seed: the sentence split (:func:`split_sentences`).
      is_test: optional explicit split, one bool per sentence (``test_fraction`` is then
        unused), e.g. held-out sentences as the test side and training-corpus sentences as
        the probes' training side (the 1-NN neighbours and the class probe's examples).
      token_subsets: optional ``{name: one bool per token of all sentences}``; each row also
        gets ``word_class_<name>``, the class probe's accuracy on the test tokens flagged
        (e.g. ``"unseen"``: word forms that never occurred in the model's training text).
      max_class_train: at most this many training tokens for the class probe (a fixed
        subsample), to keep it to seconds.
    Returns:
      rows with ``view`` (``"layer 0"``, ``"layer 1"``, ``"layer 1 fwd"``, ...,
      ``"majority baseline"`` last), ``wsd`` (accuracy), ``wsd_left`` / ``wsd_right`` /
      ``wsd_both``, ``word_class`` (accuracy) and the test counts.
    """
    if len(embeddings) != len(labels):
        raise ValueError(f"{len(embeddings)} embeddings but {len(labels)} label dicts")
    if not embeddings:
        raise ValueError("no sentences to probe")
    arrays = [np.asarray(e, dtype=np.float32) for e in embeddings]
    shape0 = arrays[0].shape
    for i, (a, lab) in enumerate(zip(arrays, labels)):
        if a.ndim != 3 or a.shape[0] != shape0[0] or a.shape[2] != shape0[2]:
            raise ValueError(
                f"embeddings[{i}] has shape {a.shape}; expected [L+1, n, {shape0[-1]}] with L+1 = {shape0[0]}"
            )
        if a.shape[1] != len(lab["classes"]) or a.shape[1] != len(lab["senses"]):
            raise ValueError(f"embeddings[{i}] has {a.shape[1]} tokens but its labels have {len(lab['classes'])}")
    if is_test is None:
        is_test_sent = split_sentences(len(arrays), test_fraction, seed)
    else:
        is_test_sent = np.asarray(is_test, dtype=bool)
        if is_test_sent.shape != (len(arrays),) or is_test_sent.all() or not is_test_sent.any():
            raise ValueError(
                f"is_test must hold one bool per sentence ({len(arrays)}) with both training and test sentences"
            )
    tok_test = np.concatenate([np.full(a.shape[1], t) for a, t in zip(arrays, is_test_sent)])
    classes = [c for lab in labels for c in lab["classes"]]
    senses = [s for lab in labels for s in lab["senses"]]
    poly = np.array([s != NO_SENSE for s in senses])
    if all("resolved_by" in lab for lab in labels):
        side_list = [x for lab in labels for x in lab["resolved_by"]]
    elif sides is not None:
        side_list = [sides.get(s.split("#", 1)[0], NO_SENSE) if s != NO_SENSE else NO_SENSE for s in senses]
    else:
        side_list = None
    poly_senses = [s for s, p in zip(senses, poly) if p]
    poly_sides = None if side_list is None else [x for x, p in zip(side_list, poly) if p]

    train_idx = np.flatnonzero(~tok_test)
    if len(train_idx) > max_class_train:
        train_idx = np.sort(np.random.default_rng(seed + 1).choice(train_idx, max_class_train, replace=False))
    test_idx = np.flatnonzero(tok_test)
    subsets = {}
    for name, given in (token_subsets or {}).items():
        flags = np.asarray(given, dtype=bool)
        if flags.shape != (len(classes),):
            raise ValueError(
                f"token_subsets[{name!r}] has {flags.shape[0] if flags.ndim else 0} flags for {len(classes)} tokens"
            )
        subsets[name] = flags[test_idx]
    y_train = [classes[i] for i in train_idx]
    y_test = [classes[i] for i in test_idx]

    rows = []
    wsd_base = None
    for name, layer, sl in _views(shape0[0], shape0[2]):
        x = np.concatenate([a[layer, :, sl] for a in arrays], axis=0)
        row: dict[str, Any] = {"view": name}
        if poly.any():
            wsd = wsd_nearest_neighbour(x[poly], poly_senses, tok_test[poly], poly_sides)
            wsd_base = wsd
            row["wsd"] = wsd["acc"]
            row["n_wsd_test"] = wsd["n_test"]
            for side in SIDES:
                row[f"wsd_{side}"] = wsd.get(f"acc_{side}", float("nan"))
        correct = logistic_regression_probe(
            x[train_idx], y_train, x[test_idx], y_test, steps=class_steps, per_token=True
        )
        row["word_class"] = float(correct.mean()) if len(correct) else float("nan")
        row["n_class_test"] = len(test_idx)
        for name, sub in subsets.items():
            row[f"word_class_{name}"] = float(correct[sub].mean()) if sub.any() else float("nan")
            row[f"n_class_test_{name}"] = int(sub.sum())
        rows.append(row)

    base: dict[str, Any] = {"view": "majority baseline"}
    if wsd_base is not None:
        base["wsd"] = wsd_base["majority"]
        base["n_wsd_test"] = wsd_base["n_test"]
        for side in SIDES:
            base[f"wsd_{side}"] = wsd_base.get(f"majority_{side}", float("nan"))
    all_train = np.flatnonzero(~tok_test)
    class_counts = Counter(classes[i] for i in all_train)
    top = min(class_counts, key=lambda c: (-class_counts[c], c)) if class_counts else None
    nan = float("nan")
    base["word_class"] = float(np.mean([classes[i] == top for i in test_idx])) if len(test_idx) else nan
    if sentences is not None:
        tokens = [w for s in sentences for w in s]
        if len(tokens) != len(classes):
            raise ValueError("sentences do not match the labels' token counts")
        per_word: dict[str, Counter] = defaultdict(Counter)
        for j in all_train:
            per_word[tokens[j]][classes[j]] += 1
        guess = {w: min(c, key=lambda k: (-c[k], k)) for w, c in per_word.items()}
        hits = np.array([guess.get(tokens[i], top) == classes[i] for i in test_idx], dtype=bool)
        base["word_class_per_word"] = float(hits.mean()) if len(test_idx) else nan
        for name, sub in subsets.items():
            base[f"word_class_per_word_{name}"] = float(hits[sub].mean()) if sub.any() else nan
    base["n_class_test"] = len(test_idx)
    for name, sub in subsets.items():
        base[f"word_class_{name}"] = float(np.mean([classes[i] == top for i in test_idx[sub]])) if sub.any() else nan
        base[f"n_class_test_{name}"] = int(sub.sum())
    rows.append(base)
    return rows


def format_probe_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`probe_table` rows (accuracies in percent)."""

    def pct(x: Any) -> str:
        return "   -" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:5.1f}"

    last = rows[-1] if rows else {}
    subsets = [k[len("n_class_test_") :] for k in last if k.startswith("n_class_test_")]
    head = f"{'view':<18} {'WSD 1-NN':>8} {'left':>6} {'right':>6} {'both':>6} {'class':>7}"
    head += "".join(f" {'class/' + n:>13}" for n in subsets)
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (
            f"{r['view']:<18} {pct(r.get('wsd')):>8} {pct(r.get('wsd_left')):>6} "
            f"{pct(r.get('wsd_right')):>6} {pct(r.get('wsd_both')):>6} {pct(r.get('word_class')):>7}"
        )
        lines.append(line + "".join(f" {pct(r.get('word_class_' + n)):>13}" for n in subsets))
        if "word_class_per_word" in r:
            line = f"{'  (per-word majority class)':<48} {pct(r['word_class_per_word']):>7}"
            lines.append(line + "".join(f" {pct(r.get('word_class_per_word_' + n)):>13}" for n in subsets))
    lines.append(
        f"WSD: accuracy over {last.get('n_wsd_test', 0)} test occurrences of polysemous "
        f"words (left/right/both: the side of the context that decides the sense); "
        f"class: linear probe accuracy over {last.get('n_class_test', 0)} test tokens"
        + "".join(f"; class/{n}: over the {last['n_class_test_' + n]} of them that are {n}" for n in subsets)
        + "."
    )
    return "\n".join(lines)
