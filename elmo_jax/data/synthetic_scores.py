"""The synthetic language (:mod:`elmo_jax.data.synthetic`) sampled and scored: sentences with
their labels, the perplexity of the true distribution (the floor any language model has),
unigram and bigram baselines, and the exact sense posteriors an ideal model would hold."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from elmo_jax.data.vocab import BOS, UNK
from elmo_jax.data.synthetic import END, NO_SENSE, SyntheticLanguage

__all__ = ["ngram_baselines", "optimum_perplexity", "oracle_embeddings", "sample_corpus"]


def sample_corpus(
    language: SyntheticLanguage, n: int, rng: np.random.Generator
) -> tuple[list[list[str]], list[dict[str, list[str]]]]:
    """``n`` sentences and their label dicts (``classes``, ``senses``, ``resolved_by``)."""
    sentences, labels = [], []
    for _ in range(n):
        toks, classes, senses = language.sample_sentence(rng)
        sentences.append(toks)
        resolved = [language.polysemous[s.split("#", 1)[0]]["side"] if s != NO_SENSE else NO_SENSE for s in senses]
        labels.append({"classes": classes, "senses": senses, "resolved_by": resolved})
    return sentences, labels


def optimum_perplexity(
    language: SyntheticLanguage, sentences: Sequence[Sequence[str]], known: Sequence[str] | None = None
) -> float:
    """Perplexity of the true distribution: ``exp(-sum log p(s) / sum (len(s) + 1))``.

    No language model can do better in expectation (forward or backward).  With ``known``,
    forms outside it are collapsed into one ``<UNK>`` event (see
    :meth:`SyntheticLanguage.log_probs`): the optimum for a model with that closed vocabulary.
    """
    if not sentences:
        raise ValueError("sentences is empty")
    lp = language.log_probs(sentences, known=known)
    n = sum(len(s) + 1 for s in sentences)
    return float(math.exp(-lp.sum() / n))


def ngram_baselines(
    train: Sequence[Sequence[str]], heldout: Sequence[Sequence[str]], k: float = 0.1, discount: float = 0.75
) -> dict[str, float]:
    """Unigram and bigram perplexities (trained on ``train``, measured on ``heldout``).

    Events are the training forms, ``</S>`` and ``<UNK>`` (held-out forms not seen in
    training are scored as ``<UNK>``; the same convention as ``optimum_perplexity(...,
    known=train_vocab)``).  One prediction per token plus one for ``</S>``.

    * unigram: add-``k``; ``<UNK>`` gets the count of training singletons (the Good-Turing
      estimate of the unseen mass);
    * bigram: interpolated absolute discounting (``discount``) over ``<S>`` + tokens, backing
      off to the unigram; an unseen history uses the unigram alone.
    """
    uni: Counter[str] = Counter()
    bi: dict[str, Counter] = {}
    for s in train:
        prev = BOS
        for w in list(s) + [END]:
            uni[w] += 1
            bi.setdefault(prev, Counter())[w] += 1
            prev = w
    n1 = sum(1 for w, c in uni.items() if c == 1 and w != END)
    counts: dict[str, int] = dict(uni)
    counts[UNK] = max(n1, 1)
    total = sum(counts.values()) + k * len(counts)

    def p_uni(w: str) -> float:
        return (counts.get(w, counts[UNK]) + k) / total

    def norm(w: str) -> str:
        return w if w in uni else UNK

    hist = {h: (sum(c.values()), len(c)) for h, c in bi.items()}
    lp_u = lp_b = 0.0
    n = 0
    for s in heldout:
        prev = BOS
        for w in [norm(x) for x in s] + [END]:
            pu = p_uni(w)
            lp_u += math.log(pu)
            if prev in bi:
                tot, types = hist[prev]
                pb = max(bi[prev].get(w, 0) - discount, 0.0) / tot + discount * types / tot * pu
            else:
                pb = pu
            lp_b += math.log(pb)
            n += 1
            prev = w
    return {"unigram": math.exp(-lp_u / n), "bigram": math.exp(-lp_b / n)}


def oracle_embeddings(
    language: SyntheticLanguage, sentences: Sequence[Sequence[str]], n_layers: int = 2
) -> list[np.ndarray]:
    """What an ideal biLM would know, in the layout of ``Elmo.embed``: ``[L+1, n, 2S]``.

    Layer 0 is ``[e; e]`` with ``e`` the state posterior given the word alone (uniform
    prior); every LSTM layer is ``[forward ; backward]`` where *forward* is the filtering
    posterior ``p(state_t | w_1..w_t)`` and *backward* ``p(state_t | w_t..w_n, </S>)``
    (uniform prior on ``state_t``).  Probes on these vectors show what each direction can
    know at best; the forward half cannot resolve right-resolved words and vice versa.
    """
    out = []
    idx = language._word_index  # noqa: SLF001 - set in its __post_init__
    for s in sentences:
        unknown = [w for w in s if w not in idx]
        if unknown or not s:
            raise ValueError(f"cannot embed {list(s)!r}: empty or with forms the language lacks ({unknown[:5]})")
        ids = [idx[w] for w in s]
        e = language.emit[:, ids].T  # [n, S]
        n, n_states = e.shape
        fwd = np.zeros((n, n_states))
        a = language.start * e[0]
        fwd[0] = a / a.sum()
        for t in range(1, n):
            a = (fwd[t - 1] @ language.trans) * e[t]
            fwd[t] = a / a.sum()
        beta = np.zeros((n, n_states))
        b = language.end.copy()
        beta[n - 1] = b / max(b.sum(), 1e-300)
        for t in range(n - 2, -1, -1):
            b = language.trans @ (e[t + 1] * beta[t + 1])
            beta[t] = b / max(b.sum(), 1e-300)
        bwd = e * beta
        bwd /= bwd.sum(1, keepdims=True)
        tok = e / e.sum(1, keepdims=True)
        layers = [np.concatenate([tok, tok], 1)] + [np.concatenate([fwd, bwd], 1)] * n_layers
        out.append(np.stack(layers).astype(np.float32))
    return out
