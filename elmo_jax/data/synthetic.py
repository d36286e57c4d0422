"""The project's own training corpus: a seeded hidden Markov language with a known optimum.

Three modules, one job each: this one is the language (the HMM, its grammar and word forms:
over 500 lines because the grammar's word lists and frames are data that belong with the code
that compiles them); :mod:`~elmo_jax.data.synthetic_scores` samples and scores it (the optimum,
n-gram baselines, oracle embeddings); :mod:`~elmo_jax.data.synthetic_corpus` writes and reads
the corpus files and holds the ``elmo-jax corpus`` command.

``python train.py`` and the tests need text that is free to make, needs no download and
whose best achievable perplexity is known exactly.  This module builds such a language.

The generator
-------------
:func:`make_language` compiles a small grammar into a hidden Markov model (HMM):

* every hidden *state* has a word class (``NOUN``, ``VERB``, ``DET`` ... the same tags for
  English and Chinese), optionally a *sense* (``"bank#money"``), and an emission
  distribution over word forms;
* ``start[s]`` is the probability of the first state, ``trans[s, s']`` of moving on and
  ``end[s]`` of ending the sentence after ``s`` (``trans[s].sum() + end[s] == 1``).

The grammar mixes English-like clauses (made-up stems with regular inflection, real
function words) and Chinese clauses, with occasional code switching after a conjunction.
It has

* **productive morphology**: generated noun stems take ``-s``, verb stems ``-s``/``-ed``/
  ``-ing``, adjectives form ``-ly`` adverbs; stems are drawn from a Zipf-like law, so held-out
  text contains inflected forms never seen in training while their stems were;
* **polysemous words** whose sense is a hidden state and is resolved by context
  (see :data:`FRAMES`): *left*-resolved words (the sense depends only on earlier words: both
  sense states have identical outgoing transitions, so later words carry no information),
  *right*-resolved words (both senses are reached from the same state with fixed odds, so
  earlier words carry no information, and each sense leads to words only it can be followed
  by), and words resolved by *both* sides.  A forward language model alone can therefore not
  tell the senses of right-resolved words apart, a backward one not those of left-resolved
  words; :func:`~elmo_jax.data.synthetic_scores.oracle_embeddings` gives the exact posteriors that an ideal model would hold;
* a Zipf-like word-frequency tail and sentence lengths from 1 to about 40 tokens.

Scoring
-------
:meth:`SyntheticLanguage.log_prob` is the exact log-probability of a token sequence including
the end-of-sentence event, summed over all state paths with the forward algorithm (scaled
forward recursion: every step is renormalised and the log of the scale is accumulated, which
is the log-space computation without ``logsumexp`` cost).  :func:`~elmo_jax.data.synthetic_scores.optimum_perplexity` turns it
into the perplexity of the true distribution, ``exp(-sum log p(s) / sum (len(s) + 1))`` -- the
``+1`` is the ``</S>`` prediction.  By the chain rule the same number is the optimum for a
forward *and* for a backward language model, so it is the floor for ELMo's reported
``exp(0.5 * (loss_fwd + loss_bwd))``.  :func:`~elmo_jax.data.synthetic_scores.ngram_baselines`
gives unigram and bigram perplexities for contrast.

Domains
-------
``domain="b"`` (``elmo-jax corpus --domain b``) makes a second domain of the same language
for continued-pretraining experiments: the grammar and the function words are the same, but

* the vocabulary shifts: a quarter of the noun, verb and adjective stems are replaced by new
  ones, and the Zipf ranks of all stems are shuffled (words common in one domain are rare in
  the other);
* the word senses shift: in every polysemous frame the first listed sense (``bank#money``,
  ``bass#music`` ...) falls to 20% and the others share 80%.

The default ``domain="a"`` is the language above, unchanged.  Domain B draws its changes
from a random stream of its own, so the stems the two domains share are the same words.

Corpus files
------------
:func:`elmo_jax.data.synthetic_corpus.write_corpus` writes ``train.txt``, ``heldout.txt`` (one sentence a line, tokens
separated by single spaces, UTF-8), ``train.labels.jsonl`` / ``heldout.labels.jsonl``
(per sentence ``{"classes": [...], "senses": [...], "resolved_by": [...]}`` aligned with the
tokens; ``"-"`` marks tokens without a sense) and ``stats.json``.  The same seed gives
byte-identical files.  ``elmo-jax corpus`` is its command line.

Default size (:data:`DEFAULT_N_TRAIN` = 40,000 training sentences, about 300k tokens, mean
length 7.6, lengths 1..40; :data:`DEFAULT_N_HELDOUT` = 2,000 held-out sentences, about 15.7k
tokens) is chosen so that the ``tiny`` preset sees the corpus a few times in about ten minutes
on two CPU cores.  With seed 0 the language has 6,126 word forms (5,221 occur in training);
the held-out text has 50 tokens unseen in training, 48 of them new inflections of seen stems.
Held-out perplexities: optimum 27.25 (unseen words merged into ``<UNK>``), bigram 50.6,
unigram 327.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_jax.data.vocab import EOS, UNK

__all__ = [
    "DEFAULT_N_HELDOUT",
    "DOMAINS",
    "DEFAULT_N_TRAIN",
    "DEFAULT_SEED",
    "FRAMES",
    "NO_SENSE",
    "SyntheticLanguage",
    "make_language",
    "random_language",
]

DEFAULT_SEED = 0
DEFAULT_N_TRAIN = 40_000
DEFAULT_N_HELDOUT = 2_000
DOMAINS = ("a", "b")
# Domain b: the share of the stems replaced by new ones, and the weight left to the first
# sense of every polysemous word.
DOMAIN_B_NEW_STEMS = 0.25
DOMAIN_B_FIRST_SENSE = 0.2
NO_SENSE = "-"
END = EOS

# The sampler's draw table of one distribution: the outcomes with p > 0 and their cumulative
# probabilities.
_Table = tuple[list[int], list[float]]


# --------------------------------------------------------------------------------------
# The language object
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class SyntheticLanguage:
    """A hidden Markov language over word forms.

    Attributes:
      seed: the seed it was made from (``None`` for hand-built ones).
      vocab: the word forms; a form's index is its id.
      state_names, state_classes, state_senses: per state; ``state_senses[s]`` is
        ``"word#sense"`` for the states that emit a polysemous word and ``None`` otherwise.
      start: ``[S]`` first-state probabilities.
      trans: ``[S, S]`` transition probabilities.
      end: ``[S]`` probability of ending the sentence after a state.
      emit: ``[S, V]`` emission probabilities (rows sum to 1).
      polysemous: ``{word: {"side": "left"|"right"|"both", "senses": [...]}}``.
      max_len: sentences longer than this are rejected by the sampler and get probability 0
        from the scorer, which divides by ``P(len <= max_len)`` so the distribution stays
        normalised; ``None`` for no limit.
      lemmas: ``{word form: stem}`` for the inflected (generated) forms, so that a form
        never seen in training can be traced to a stem that was.
    """

    seed: int | None
    vocab: tuple[str, ...]
    state_names: tuple[str, ...]
    state_classes: tuple[str, ...]
    state_senses: tuple[str | None, ...]
    start: np.ndarray
    trans: np.ndarray
    end: np.ndarray
    emit: np.ndarray
    polysemous: dict[str, dict[str, Any]]
    max_len: int | None = None
    lemmas: dict[str, str] = dataclasses.field(default_factory=dict)

    if TYPE_CHECKING:  # set by __post_init__ (the class is frozen); at run time not dataclass fields
        _word_index: dict[str, int] = dataclasses.field(init=False)
        _sampler: tuple[_Table, list[_Table], list[_Table]] = dataclasses.field(init=False)
        _log_z: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        s, v = len(self.state_names), len(self.vocab)
        if self.start.shape != (s,) or self.trans.shape != (s, s) or self.end.shape != (s,):
            raise ValueError("start/trans/end shapes do not match the number of states")
        if self.emit.shape != (s, v):
            raise ValueError(f"emit must be [{s}, {v}], got {list(self.emit.shape)}")
        rows_ok = np.allclose(self.trans.sum(1) + self.end, 1.0)
        if not rows_ok or not np.isclose(self.start.sum(), 1.0):
            raise ValueError("transition rows (with the end probability) must sum to 1")
        if not np.allclose(self.emit.sum(1), 1.0):
            raise ValueError("emission rows must sum to 1")
        object.__setattr__(self, "_word_index", {w: i for i, w in enumerate(self.vocab)})
        object.__setattr__(self, "_sampler", self._build_sampler())
        log_z = 0.0
        if self.max_len is not None:
            if self.max_len < 1:
                raise ValueError(f"max_len must be >= 1, got {self.max_len}")
            log_z = float(np.log(self.length_distribution(self.max_len).sum()))
        object.__setattr__(self, "_log_z", log_z)

    # -- sampling ----------------------------------------------------------------------
    def _build_sampler(self) -> tuple[_Table, list[_Table], list[_Table]]:
        def table(p: np.ndarray) -> _Table:
            idx = np.flatnonzero(p > 0)
            cum = np.cumsum(p[idx])
            cum /= cum[-1]
            return idx.tolist(), cum.tolist()

        n = len(self.state_names)
        start = table(self.start)
        nxt = [table(np.append(self.trans[s], self.end[s])) for s in range(n)]
        emit = [table(self.emit[s]) for s in range(n)]
        return start, nxt, emit

    def sample_sentence(self, rng: np.random.Generator) -> tuple[list[str], list[str], list[str]]:
        """Draws one sentence: ``(tokens, classes, senses)``, ``senses[i]`` ``"-"`` if none.

        Deterministic given the state of ``rng`` (a ``numpy.random.Generator``).  A sentence
        longer than ``max_len`` is thrown away and drawn again.
        """
        start, nxt, emit = self._sampler
        n_states = len(self.state_names)

        def draw(tab) -> int:
            idx, cum = tab
            k = bisect.bisect_right(cum, rng.random())
            return idx[min(k, len(idx) - 1)]

        limit = self.max_len if self.max_len is not None else math.inf
        tokens: list[str]
        classes: list[str]
        senses: list[str]
        while True:
            tokens, classes, senses = [], [], []
            s = draw(start)
            while s != n_states and len(tokens) <= limit:
                tokens.append(self.vocab[draw(emit[s])])
                classes.append(self.state_classes[s])
                senses.append(self.state_senses[s] or NO_SENSE)
                s = draw(nxt[s])
            if len(tokens) <= limit:
                return tokens, classes, senses

    # -- scoring -----------------------------------------------------------------------
    def _emission_columns(self, known: Sequence[str] | None) -> tuple[dict[str, int], np.ndarray]:
        """Word -> column and the emission matrix ``[V', S]`` used for scoring.

        With ``known`` every form outside it is one event ``<UNK>`` whose probability under a
        state is the total emission mass of the forms outside ``known``.
        """
        if known is None:
            return self._word_index, self.emit.T
        known_ids = sorted({self._word_index[w] for w in known if w in self._word_index})
        cols = self.emit[:, known_ids].T
        unk = 1.0 - cols.sum(0)
        index = {self.vocab[i]: j for j, i in enumerate(known_ids)}
        index[UNK] = len(known_ids)
        return index, np.vstack([cols, np.clip(unk, 0.0, None)[None, :]])

    def log_probs(
        self, sentences: Sequence[Sequence[str]], known: Sequence[str] | None = None, batch_size: int = 512
    ) -> np.ndarray:
        """Exact natural-log probabilities of many sentences (see :meth:`log_prob`).

        Args:
          sentences: token lists.
          known: optional closed vocabulary; tokens outside it are scored as one ``<UNK>``
            event (the probability of emitting *any* form outside ``known``), which is the
            event space of a language model whose vocabulary is ``known`` plus ``<UNK>``.
        Returns:
          ``float64 [len(sentences)]``; ``-inf`` for impossible sentences.
        """
        index, emit_t = self._emission_columns(known)
        unk_col = index.get(UNK)
        zero_col = emit_t.shape[0]
        emit_t = np.vstack([emit_t, np.zeros((1, emit_t.shape[1]))])
        out = np.empty(len(sentences))
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        for b0 in range(0, len(order), batch_size):
            chunk = order[b0 : b0 + batch_size]
            lens = np.array([len(sentences[i]) for i in chunk])
            t_max = int(lens.max()) if len(chunk) else 0
            ids = np.full((len(chunk), max(t_max, 1)), zero_col, dtype=np.int64)
            for r, i in enumerate(chunk):
                for t, w in enumerate(sentences[i]):
                    col = index.get(w)
                    if col is None:
                        col = unk_col if unk_col is not None else zero_col
                    ids[r, t] = col
            logp = np.zeros(len(chunk))
            alpha = None
            for t in range(t_max):
                e = emit_t[ids[:, t]]
                new = e * (self.start[None, :] if t == 0 else alpha @ self.trans)
                active = lens > t
                if alpha is not None:
                    new = np.where(active[:, None], new, alpha)
                c = new.sum(1)
                ok = c > 0
                with np.errstate(divide="ignore"):
                    logp += np.where(active, np.log(np.where(ok, c, 0.0)), 0.0)
                alpha = new / np.where(ok, c, 1.0)[:, None]
            if alpha is None:  # only empty sentences: impossible (length >= 1)
                logp[:] = -np.inf
            else:
                with np.errstate(divide="ignore"):
                    logp += np.log(alpha @ self.end)
                logp[lens == 0] = -np.inf
            logp -= self._log_z
            if self.max_len is not None:
                logp[lens > self.max_len] = -np.inf
            out[chunk] = logp
        return out

    def log_prob(self, tokens: Sequence[str], known: Sequence[str] | None = None) -> float:
        """Exact ``log p(tokens, </S>)``: sums over every state path that emits ``tokens``.

        Forward algorithm: ``alpha_1 = start * emit[:, x1]``, ``alpha_t = (alpha_{t-1} @ trans)
        * emit[:, xt]``, ``p = alpha_n @ end``, renormalising each step and adding the log
        scale.  A token the language cannot emit gives ``-inf``.
        """
        return float(self.log_probs([list(tokens)], known=known)[0])

    def length_distribution(self, max_len: int) -> np.ndarray:
        """``P(len == n)``, ``n = 0 .. max_len``, ignoring any length limit (emissions summed out)."""
        p = np.zeros(max_len + 1)
        a = self.start.copy()
        for n in range(1, max_len + 1):
            p[n] = a @ self.end
            a = a @ self.trans
        return p


# --------------------------------------------------------------------------------------
# Grammar compilation
# --------------------------------------------------------------------------------------


class _Builder:
    """Collects states, virtual (silent) nodes and weighted edges, then compiles an HMM."""

    def __init__(self) -> None:
        self.states: list[dict[str, Any]] = []
        self.index: dict[str, int] = {}
        self.edges: dict[str, list[tuple[str, float]]] = {}
        self.virtual: dict[str, list[tuple[str, float]]] = {}
        self.vocab: list[str] = []
        self.word_ids: dict[str, int] = {}
        self.polysemous: dict[str, dict[str, Any]] = {}

    def word(self, w: str) -> int:
        if w not in self.word_ids:
            self.word_ids[w] = len(self.vocab)
            self.vocab.append(w)
        return self.word_ids[w]

    def state(
        self,
        name: str,
        cls: str,
        words: Sequence[str],
        weights: Sequence[float] | None = None,
        sense: str | None = None,
    ) -> str:
        if name in self.index or name in self.virtual:
            raise ValueError(f"duplicate state {name!r}")
        if weights is None:
            weights = zipf_weights(len(words), 0.6)
        ids = [self.word(w) for w in words]
        self.index[name] = len(self.states)
        self.states.append(dict(name=name, cls=cls, sense=sense, ids=ids, weights=list(weights)))
        self.edges[name] = []
        return name

    def node(self, name: str, targets: Iterable[tuple[str, float]] = ()) -> str:
        if name in self.index or name in self.virtual:
            raise ValueError(f"duplicate node {name!r}")
        self.virtual[name] = list(targets)
        return name

    def link(self, src: str, targets: Iterable[tuple[str, float]]) -> None:
        (self.edges[src] if src in self.edges else self.virtual[src]).extend(targets)

    def _resolve(self, targets: list[tuple[str, float]], depth: int = 0) -> dict[int, float]:
        if depth > 20:
            raise ValueError("cycle among silent nodes")
        total = sum(w for _, w in targets)
        out: dict[int, float] = {}
        for name, w in targets:
            if w <= 0:
                continue
            if name == END:
                out[-1] = out.get(-1, 0.0) + w / total
            elif name in self.index:
                k = self.index[name]
                out[k] = out.get(k, 0.0) + w / total
            else:
                for k, p in self._resolve(self.virtual[name], depth + 1).items():
                    out[k] = out.get(k, 0.0) + p * w / total
        return out

    def compile(
        self, start: str, seed: int | None, max_len: int | None = None, lemmas: dict[str, str] | None = None
    ) -> SyntheticLanguage:
        n, v = len(self.states), len(self.vocab)
        start_v = np.zeros(n)
        for k, p in self._resolve([(start, 1.0)]).items():
            if k < 0:
                raise ValueError("the empty sentence must be impossible")
            start_v[k] += p
        trans = np.zeros((n, n))
        end = np.zeros(n)
        emit = np.zeros((n, v))
        for i, st in enumerate(self.states):
            if not self.edges[st["name"]]:
                raise ValueError(f"state {st['name']!r} has no way out")
            for k, p in self._resolve(self.edges[st["name"]]).items():
                if k < 0:
                    end[i] += p
                else:
                    trans[i, k] += p
            w = np.asarray(st["weights"], dtype=np.float64)
            np.add.at(emit[i], st["ids"], w / w.sum())
        return SyntheticLanguage(
            seed=seed,
            vocab=tuple(self.vocab),
            state_names=tuple(s["name"] for s in self.states),
            state_classes=tuple(s["cls"] for s in self.states),
            state_senses=tuple(s["sense"] for s in self.states),
            start=start_v,
            trans=trans,
            end=end,
            emit=emit,
            polysemous=self.polysemous,
            max_len=max_len,
            lemmas=dict(lemmas or {}),
        )


def _mix(a: Sequence[float], b: Sequence[float], share: float) -> list[float]:
    """``a`` and ``b`` normalised and concatenated with masses ``1 - share`` and ``share``."""
    sa, sb = sum(a), sum(b)
    return [x * (1 - share) / sa for x in a] + [x * share / sb for x in b]


def zipf_weights(n: int, exponent: float = 1.0, offset: float = 1.0) -> list[float]:
    """``1 / (rank + offset) ** exponent`` for ranks ``1..n`` (unnormalised)."""
    return [1.0 / (r + offset) ** exponent for r in range(1, n + 1)]


# --------------------------------------------------------------------------------------
# Vocabulary: made-up English-like stems and their inflections
# --------------------------------------------------------------------------------------

_ONSETS = ("b bl br d dr f fl fr g gl gr k kl kr l m n p pl pr r s sk sl sn sp st t tr v w z sh ch th").split()
_NUCLEI = "a e i o u a e i o u ee oo ai ou oa".split()
_CODAS = ["", "", "", "b", "d", "g", "k", "l", "m", "n", "p", "r", "t", "sk", "st", "nd", "mp", "nt", "lk", "rn"]


def _pseudo_word(rng: np.random.Generator) -> str:
    n_syll = 1 if rng.random() < 0.45 else 2
    parts = []
    for i in range(n_syll):
        parts.append(_ONSETS[rng.integers(len(_ONSETS))])
        parts.append(_NUCLEI[rng.integers(len(_NUCLEI))])
        if i == n_syll - 1 or rng.random() < 0.3:
            parts.append(_CODAS[rng.integers(len(_CODAS))])
    return "".join(parts)


def _plural(stem: str) -> str:
    return stem + ("es" if stem.endswith(("s", "sh", "ch", "x", "z")) else "s")


def _verb_forms(stem: str) -> dict[str, str]:
    if stem.endswith("e"):
        return {"base": stem, "3sg": stem + "s", "past": stem + "d", "ing": stem[:-1] + "ing"}
    s3 = stem + ("es" if stem.endswith(("s", "sh", "ch", "x", "z")) else "s")
    return {"base": stem, "3sg": s3, "past": stem + "ed", "ing": stem + "ing"}


def _adverb(adj: str) -> str:
    return adj[:-1] + "ily" if adj.endswith("y") else adj + "ly"


def _make_stems(rng: np.random.Generator, n: int, taken: set[str], forms_of) -> list[str]:
    """``n`` new stems none of whose forms collides with ``taken`` (updated in place)."""
    out: list[str] = []
    while len(out) < n:
        stem = _pseudo_word(rng)
        forms = forms_of(stem)
        if len(stem) < 3 or any(f in taken for f in forms) or len(set(forms)) != len(forms):
            continue
        taken.update(forms)
        out.append(stem)
    return out


# --------------------------------------------------------------------------------------
# Fixed words of the grammar
# --------------------------------------------------------------------------------------

_EN_FUNCTION = {
    "DET_SG": ["the", "a", "this", "that", "every", "one"],
    "DET_PL": ["the", "these", "some", "many", "those", "two", "three"],
    "PDET": ["the", "a", "his", "her", "their", "our", "my"],
    "PRON_3SG": ["she", "he", "it"],
    "PRON_N3": ["they", "we", "i", "you"],
    "AUX_SG": ["is", "was"],
    "AUX_PL": ["are", "were"],
    "PREP": ["in", "on", "with", "for", "under", "behind", "over", "about", "into", "after"],
    "CONJ": ["and", "but", "so", "because", "while", "then"],
    "INTJ": ["yes", "no", "ok", "hello", "thanks", "好", "嗯", "谢谢"],
}
_ZH = {
    "PRON": ["我", "你", "她", "他", "我们", "他们", "大家", "你们"],
    "NAME": ["小明", "小红", "老王", "张老师", "李华", "王芳"],
    "ADV": ["也", "都", "常常", "今天", "已经", "明天", "一起", "马上"],
    "VERB": [
        "吃",
        "看",
        "买",
        "喜欢",
        "想",
        "学习",
        "写",
        "找",
        "等",
        "帮助",
        "认识",
        "准备",
        "需要",
        "带",
        "卖",
        "送",
        "借",
        "做",
        "听",
        "画",
    ],
    "MOTION": ["去", "来", "回", "到"],
    "PURPOSE": ["取钱", "上课", "买东西", "看病", "吃饭", "工作", "开会", "存钱"],
    "ASP": ["了", "过", "着"],
    "NOUN": [
        "书",
        "水",
        "饭",
        "茶",
        "咖啡",
        "电脑",
        "朋友",
        "老师",
        "学生",
        "衣服",
        "苹果",
        "面包",
        "报纸",
        "电影",
        "音乐",
        "汽车",
        "自行车",
        "房子",
        "猫",
        "狗",
        "鱼",
        "鸡蛋",
        "水果",
        "蛋糕",
        "礼物",
        "问题",
        "作业",
        "新闻",
        "故事",
        "照片",
        "信",
        "票",
        "地图",
        "雨伞",
        "眼镜",
        "杯子",
        "桌子",
        "椅子",
        "钥匙",
        "邮件",
        "歌",
        "画儿",
        "菜",
        "汤",
        "药",
        "机会",
        "衬衫",
        "鞋",
        "帽子",
        "蔬菜",
        "牛奶",
        "啤酒",
        "飞机",
        "火车",
    ],
    "PLACE": ["银行", "学校", "公园", "医院", "商店", "图书馆", "家", "公司", "饭馆", "北京"],
    "PREP": ["在", "从", "跟"],
    "CONJ": ["然后", "但是", "所以", "因为", "而且"],
}

# Polysemous words.  ``entry``: the silent nodes that may start the frame (with a weight);
# ``exit``: where it continues; ``shared_left``: slots before the sense choice (identical for
# all senses); per sense: its ``left`` slots (between the shared part and the word) and
# ``right`` slots (after it).  A slot is ``(class, [words])``.  Left-resolved words have
# sense-specific left slots only, right-resolved ones sense-specific right slots only.
FRAMES: tuple[dict[str, Any], ...] = (
    dict(
        word="bank",
        side="left",
        cls="NOUN",
        entry=("PRED_E", 0.05),
        exit="NP_REST_E",
        senses={
            "money": (
                0.55,
                [
                    ("VERB", ["deposited", "withdrew", "borrowed", "saved", "invested", "wired", "counted", "owed"]),
                    ("ADP", ["at", "from", "with"]),
                    ("DET", ["the", "a"]),
                ],
                [],
            ),
            "river": (
                0.45,
                [
                    ("VERB", ["fished", "camped", "swam", "rested", "picnicked", "waded", "sunbathed", "paddled"]),
                    ("ADP", ["by", "near", "along", "beside"]),
                    ("DET", ["the"]),
                ],
                [],
            ),
        },
    ),
    dict(
        word="bass",
        side="left",
        cls="NOUN",
        entry=("PRED_E", 0.04),
        exit="NP_REST_E",
        senses={
            "music": (
                0.5,
                [
                    ("VERB", ["played", "tuned", "strummed", "amplified", "practiced"]),
                    ("DET", ["the", "a", "her", "his"]),
                ],
                [],
            ),
            "fish": (
                0.5,
                [("VERB", ["caught", "hooked", "grilled", "cooked", "landed", "netted"]), ("DET", ["a", "the", "one"])],
                [],
            ),
        },
    ),
    dict(
        word="crane",
        side="left",
        cls="NOUN",
        entry=("PRED_E", 0.04),
        exit="NP_REST_E",
        senses={
            "bird": (
                0.45,
                [
                    ("VERB", ["photographed", "fed", "spotted", "sketched"]),
                    ("DET", ["a", "the"]),
                    ("ADJ", ["white", "tall", "graceful", "wild"]),
                ],
                [],
            ),
            "machine": (
                0.55,
                [
                    ("VERB", ["operated", "repaired", "rented", "lowered", "assembled"]),
                    ("DET", ["the", "a"]),
                    ("ADJ", ["yellow", "rusty", "huge", "electric"]),
                ],
                [],
            ),
        },
    ),
    dict(
        word="bat",
        side="right",
        cls="NOUN",
        entry=("CLAUSE_E", 0.05),
        exit="CLAUSE_END_E",
        shared_left=[("DET", ["the", "that", "this"])],
        senses={
            "animal": (0.5, [], [("VERB", ["flew", "squeaked", "hunted", "slept", "hung"])]),
            "club": (0.5, [], [("VERB", ["cracked", "splintered", "broke", "snapped"])]),
        },
    ),
    dict(
        word="seal",
        side="right",
        cls="NOUN",
        entry=("CLAUSE_E", 0.04),
        exit="CLAUSE_END_E",
        shared_left=[("DET", ["the", "a", "that"])],
        senses={
            "animal": (0.55, [], [("VERB", ["barked", "dived", "basked", "splashed"])]),
            "stamp": (0.45, [], [("AUX", ["was", "looked"]), ("VERB", ["broken", "forged", "stamped", "approved"])]),
        },
    ),
    dict(
        word="date",
        side="right",
        cls="NOUN",
        entry=("CLAUSE_E", 0.04),
        exit="CLAUSE_END_E",
        shared_left=[("DET", ["the", "that", "our"])],
        senses={
            "fruit": (0.4, [], [("AUX", ["was", "seemed"]), ("ADJ", ["sweet", "sticky", "ripe", "delicious"])]),
            "calendar": (
                0.6,
                [],
                [("AUX", ["was", "got"]), ("VERB", ["postponed", "cancelled", "moved", "confirmed"])],
            ),
        },
    ),
    dict(
        word="spring",
        side="both",
        cls="NOUN",
        entry=("CLAUSE_E", 0.04),
        exit="CLAUSE_END_E",
        shared_left=[("DET", ["the", "that"])],
        senses={
            "season": (
                0.5,
                [("ADJ", ["early", "late", "warm", "rainy"])],
                [("VERB", ["arrived", "ended", "began", "returned"])],
            ),
            "water": (
                0.5,
                [("ADJ", ["hot", "mineral", "icy", "hidden"])],
                [("VERB", ["bubbled", "flowed", "steamed", "trickled"])],
            ),
        },
    ),
    dict(
        word="bark",
        side="both",
        cls="NOUN",
        entry=("CLAUSE_E", 0.03),
        exit="CLAUSE_END_E",
        shared_left=[("DET", ["the", "a"])],
        senses={
            "dog": (
                0.5,
                [("ADJ", ["loud", "angry", "sharp", "sudden"])],
                [("VERB", ["echoed", "startled", "woke", "frightened"])],
            ),
            "tree": (
                0.5,
                [("ADJ", ["rough", "thick", "smooth", "brown"])],
                [("VERB", ["peeled", "flaked", "crumbled", "darkened"])],
            ),
        },
    ),
    dict(
        word="米",
        side="left",
        cls="NOUN",
        entry=("PRED_Z", 0.07),
        exit="CLAUSE_END_Z",
        senses={
            "rice": (
                0.5,
                [
                    ("VERB", ["买", "煮", "吃", "洗"]),
                    ("PART", ["了"]),
                    ("NUM", ["两", "三", "五"]),
                    ("NOUN", ["斤", "碗", "袋"]),
                ],
                [],
            ),
            "meter": (
                0.5,
                [("VERB", ["跑", "游", "走", "爬"]), ("PART", ["了"]), ("NUM", ["一百", "八百", "五千"])],
                [],
            ),
        },
    ),
    dict(
        word="打",
        side="right",
        cls="VERB",
        entry=("PRED_Z", 0.07),
        exit="CLAUSE_END_Z",
        shared_left=[("ADV", ["也", "常常", "经常", "不"])],
        senses={
            "call": (0.45, [], [("NOUN", ["电话", "手机", "热线"])]),
            "play": (0.55, [], [("NOUN", ["篮球", "网球", "游戏", "牌"])]),
        },
    ),
    dict(
        word="花",
        side="both",
        cls=None,
        entry=("CLAUSE_Z", 0.07),
        exit="CLAUSE_END_Z",
        senses={
            "flower": (0.5, [("NUM", ["一束", "一朵", "几朵", "这些"])], [("VERB", ["开", "谢", "香", "红"])]),
            "spend": (0.5, [("ADV", ["又", "总是", "不想", "别"])], [("NOUN", ["钱", "时间", "工资", "精力"])]),
        },
    ),
)
_SENSE_CLASS = {("花", "flower"): "NOUN", ("花", "spend"): "VERB"}


def _add_frame(b: _Builder, fr: dict[str, Any]) -> None:
    word = fr["word"]
    tag = f"F_{word}"
    prev = None
    for k, (cls, words) in enumerate(fr.get("shared_left", [])):
        name = b.state(f"{tag}_L{k}", cls, words)
        if prev is None:
            b.link(fr["entry"][0], [(name, fr["entry"][1])])
        else:
            b.link(prev, [(name, 1.0)])
        prev = name
    choice = b.node(f"{tag}_choice")
    if prev is None:
        b.link(fr["entry"][0], [(choice, fr["entry"][1])])
    else:
        b.link(prev, [(choice, 1.0)])
    for sense, (weight, left, right) in fr["senses"].items():
        chain = []
        for k, (cls, words) in enumerate(left):
            chain.append(b.state(f"{tag}_{sense}_L{k}", cls, words))
        cls = fr["cls"] or _SENSE_CLASS[(word, sense)]
        chain.append(b.state(f"{tag}#{sense}", cls, [word], [1.0], sense=f"{word}#{sense}"))
        for k, (cls_r, words) in enumerate(right):
            chain.append(b.state(f"{tag}_{sense}_R{k}", cls_r, words))
        b.link(choice, [(chain[0], weight)])
        for a, c in zip(chain, chain[1:]):
            b.link(a, [(c, 1.0)])
        b.link(chain[-1], [(fr["exit"], 1.0)])
    b.polysemous[word] = {"side": fr["side"], "senses": list(fr["senses"])}


def make_language(
    seed: int = DEFAULT_SEED,
    *,
    n_nouns: int = 1000,
    n_verbs: int = 500,
    n_adjs: int = 250,
    n_names: int = 30,
    zipf_exponent: float = 1.05,
    derived_share: float = 0.08,
    derived_exponent: float = 1.0,
    max_len: int | None = 40,
    domain: str = "a",
) -> SyntheticLanguage:
    """Builds the seeded default language (the same seed gives the same language).

    The seed draws the made-up English stems (and which verbs double as nouns); the grammar
    skeleton and the polysemous frames (:data:`FRAMES`) are fixed.  The ``n_*`` arguments set
    the number of generated stems; within a class, stems follow a Zipf law with
    ``zipf_exponent``; ``derived_share`` of the adjective / past-tense mass goes to the
    derived ``un-``/``re-`` forms (Zipf ``derived_exponent``).  Sentences longer than
    ``max_len`` are rejected (``None``: no limit); the scorer renormalises exactly.
    ``domain="b"``: the shifted second domain (see "Domains" in the module docstring).
    """
    seed = _check_seed(seed)
    _check_domain(domain)
    for name, val in (("n_nouns", n_nouns), ("n_verbs", n_verbs), ("n_adjs", n_adjs), ("n_names", n_names)):
        _check_positive(name, val)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    taken: set[str] = set()
    for words in _EN_FUNCTION.values():
        taken.update(words)
    for fr in FRAMES:
        taken.add(fr["word"])
        for slot in fr.get("shared_left", []):
            taken.update(slot[1])
        for _, left, right in fr["senses"].values():
            for _, words in list(left) + list(right):
                taken.update(words)
    verbs = _make_stems(
        rng,
        n_verbs,
        taken,
        lambda s: list(_verb_forms(s).values()) + ["re" + _verb_forms(s)["past"], "re" + _verb_forms(s)["ing"]],
    )
    nouns = _make_stems(rng, n_nouns, taken, lambda s: [s, _plural(s)])
    # some verb stems are nouns as well ("walks": plural noun or 3rd-person verb)
    n_shared = max(1, n_verbs // 6)
    shared = [verbs[i] for i in sorted(rng.choice(n_verbs, n_shared, replace=False).tolist())]
    for stem in shared:
        nouns.insert(int(rng.integers(len(nouns) + 1)), stem)
    adjs = _make_stems(rng, n_adjs, taken, lambda s: [s, _adverb(s), "un" + s])
    names = [w.capitalize() for w in _make_stems(rng, n_names, taken, lambda s: [s.capitalize()])]
    frames = FRAMES
    if domain == "b":
        rng_b = np.random.default_rng(np.random.SeedSequence([seed, 2]))
        verbs = _shift_stems(
            rng_b,
            verbs,
            taken,
            lambda s: list(_verb_forms(s).values()) + ["re" + _verb_forms(s)["past"], "re" + _verb_forms(s)["ing"]],
        )
        nouns = _shift_stems(rng_b, nouns, taken, lambda s: [s, _plural(s)])
        adjs = _shift_stems(rng_b, adjs, taken, lambda s: [s, _adverb(s), "un" + s])
        frames = tuple(_shift_senses(fr) for fr in FRAMES)

    zn = zipf_weights(len(nouns), zipf_exponent)
    zv = zipf_weights(len(verbs), zipf_exponent)
    za = zipf_weights(len(adjs), zipf_exponent)
    # rare derived forms ("un" + adjective, "re" + past tense / -ing form): small share, so
    # held-out text has forms never seen in training whose stems were
    adj_forms = adjs + ["un" + a for a in adjs]
    adj_w = _mix(za, zipf_weights(len(adjs), derived_exponent), derived_share)
    past_forms = [_verb_forms(v)["past"] for v in verbs]
    past_forms += ["re" + f for f in past_forms]
    past_w = _mix(zv, zipf_weights(len(verbs), derived_exponent), derived_share)
    ing_forms = [_verb_forms(v)["ing"] for v in verbs]
    ing_forms += ["re" + f for f in ing_forms]
    b = _Builder()
    S = b.state
    # ---- English clauses ----
    S("E_PRON_3SG", "PRON", _EN_FUNCTION["PRON_3SG"])
    S("E_PRON_N3", "PRON", _EN_FUNCTION["PRON_N3"])
    S("E_NAME", "PROPN", names, zipf_weights(len(names), 0.8))
    S("E_DET_SG", "DET", _EN_FUNCTION["DET_SG"])
    S("E_DET_PL", "DET", _EN_FUNCTION["DET_PL"])
    for pos in ("S", "O", "P"):  # subject, object, prepositional object
        S(f"E_ADJ_SG_{pos}", "ADJ", adj_forms, adj_w)
        S(f"E_N_SG_{pos}", "NOUN", nouns, zn)
    for pos in ("S", "O"):
        S(f"E_ADJ_PL_{pos}", "ADJ", adj_forms, adj_w)
        S(f"E_N_PL_{pos}", "NOUN", [_plural(n) for n in nouns], zn)
    S("E_ODET_SG", "DET", _EN_FUNCTION["DET_SG"])
    S("E_ODET_PL", "DET", _EN_FUNCTION["DET_PL"])
    S("E_PREP", "ADP", _EN_FUNCTION["PREP"])
    S("E_PDET", "DET", _EN_FUNCTION["PDET"])
    S("E_V_3SG", "VERB", [_verb_forms(v)["3sg"] for v in verbs], zv)
    S("E_V_BASE", "VERB", verbs, zv)
    S("E_V_PAST", "VERB", past_forms, past_w)
    S("E_V_ING", "VERB", ing_forms, past_w)
    S("E_AUX_SG", "AUX", _EN_FUNCTION["AUX_SG"])
    S("E_AUX_PL", "AUX", _EN_FUNCTION["AUX_PL"])
    S("E_ADV", "ADV", [_adverb(a) for a in adjs], za)
    S("E_ADV_PRE", "ADV", [_adverb(a) for a in adjs], za)
    S("E_CONJ", "CCONJ", _EN_FUNCTION["CONJ"])
    S("E_COMMA", "PUNCT", [","], [1.0])
    S("E_PERIOD", "PUNCT", ["."], [1.0])
    S("INTJ", "INTJ", _EN_FUNCTION["INTJ"])
    # ---- Chinese clauses ----
    S("Z_PRON", "PRON", _ZH["PRON"])
    S("Z_NAME", "PROPN", _ZH["NAME"])
    S("Z_N_SUBJ", "NOUN", _ZH["NOUN"], zipf_weights(len(_ZH["NOUN"]), 0.9))
    S("Z_ADV", "ADV", _ZH["ADV"])
    S("Z_V", "VERB", _ZH["VERB"], zipf_weights(len(_ZH["VERB"]), 0.9))
    S("Z_MOTION", "VERB", _ZH["MOTION"])
    S("Z_PURPOSE", "VERB", _ZH["PURPOSE"])
    S("Z_ASP", "PART", _ZH["ASP"])
    S("Z_OBJ", "NOUN", _ZH["NOUN"], zipf_weights(len(_ZH["NOUN"]), 0.9))
    S("Z_OBJ_EN", "NOUN", nouns, zn)
    S("Z_PREP", "ADP", _ZH["PREP"])
    S("Z_PLACE", "NOUN", _ZH["PLACE"])
    S("Z_PLACE_GOAL", "NOUN", _ZH["PLACE"])
    S("Z_CONJ", "CCONJ", _ZH["CONJ"])
    S("Z_COMMA", "PUNCT", ["，"], [1.0])
    S("Z_PERIOD", "PUNCT", ["。"], [1.0])

    N = b.node
    N("SENTENCE", [("CLAUSE_E", 0.6), ("CLAUSE_Z", 0.34), ("INTJ", 0.06)])
    N("SENT_END_E", [("E_PERIOD", 0.6), (END, 0.4)])
    N("SENT_END_Z", [("Z_PERIOD", 0.6), (END, 0.4)])
    N("CLAUSE_END_E", [("SENT_END_E", 0.62), ("E_CONJ", 0.24), ("E_COMMA", 0.08)])
    N("CLAUSE_END_Z", [("SENT_END_Z", 0.62), ("Z_CONJ", 0.22), ("Z_COMMA", 0.10)])
    N(
        "CLAUSE_E",
        [
            ("E_PRON_3SG", 0.18),
            ("E_PRON_N3", 0.18),
            ("E_NAME", 0.12),
            ("E_DET_SG", 0.25),
            ("E_DET_PL", 0.15),
            ("E_N_PL_S", 0.06),
        ],
    )
    N("PRED_3SG", [("E_V_3SG", 0.33), ("E_V_PAST", 0.33), ("E_AUX_SG", 0.14), ("E_ADV_PRE", 0.05), ("PRED_E", 0.15)])
    N("PRED_N3", [("E_V_BASE", 0.33), ("E_V_PAST", 0.33), ("E_AUX_PL", 0.14), ("E_ADV_PRE", 0.05), ("PRED_E", 0.15)])
    N("PRED_E", [])  # left-resolved English frames hang here (any subject)
    N("VP_REST", [("E_ODET_SG", 0.25), ("E_ODET_PL", 0.13), ("E_PREP", 0.17), ("E_ADV", 0.08), ("CLAUSE_END_E", 0.37)])
    N("NP_REST_E", [("E_PREP", 0.2), ("E_ADV", 0.07), ("CLAUSE_END_E", 0.73)])
    L = b.link
    L("E_PRON_3SG", [("PRED_3SG", 1)])
    L("E_NAME", [("PRED_3SG", 1)])
    L("E_PRON_N3", [("PRED_N3", 1)])
    L("E_DET_SG", [("E_ADJ_SG_S", 0.3), ("E_N_SG_S", 0.7)])
    L("E_ADJ_SG_S", [("E_ADJ_SG_S", 0.12), ("E_N_SG_S", 0.88)])
    L("E_N_SG_S", [("PRED_3SG", 1)])
    L("E_DET_PL", [("E_ADJ_PL_S", 0.3), ("E_N_PL_S", 0.7)])
    L("E_ADJ_PL_S", [("E_ADJ_PL_S", 0.12), ("E_N_PL_S", 0.88)])
    L("E_N_PL_S", [("PRED_N3", 1)])
    L("E_ADV_PRE", [("E_V_PAST", 1)])
    L("E_AUX_SG", [("E_V_ING", 1)])
    L("E_AUX_PL", [("E_V_ING", 1)])
    for v in ("E_V_3SG", "E_V_BASE", "E_V_PAST", "E_V_ING"):
        L(v, [("VP_REST", 1)])
    L("E_ODET_SG", [("E_ADJ_SG_O", 0.3), ("E_N_SG_O", 0.7)])
    L("E_ADJ_SG_O", [("E_ADJ_SG_O", 0.12), ("E_N_SG_O", 0.88)])
    L("E_N_SG_O", [("NP_REST_E", 1)])
    L("E_ODET_PL", [("E_ADJ_PL_O", 0.3), ("E_N_PL_O", 0.7)])
    L("E_ADJ_PL_O", [("E_ADJ_PL_O", 0.12), ("E_N_PL_O", 0.88)])
    L("E_N_PL_O", [("NP_REST_E", 1)])
    L("E_PREP", [("E_PDET", 1)])
    L("E_PDET", [("E_ADJ_SG_P", 0.25), ("E_N_SG_P", 0.75)])
    L("E_ADJ_SG_P", [("E_N_SG_P", 1)])
    L("E_N_SG_P", [("NP_REST_E", 1)])
    L("E_ADV", [("CLAUSE_END_E", 1)])
    L("E_COMMA", [("E_CONJ", 1)])
    L("E_CONJ", [("CLAUSE_E", 0.9), ("CLAUSE_Z", 0.1)])
    L("E_PERIOD", [(END, 1)])
    L("INTJ", [(END, 0.75), ("E_COMMA", 0.15), ("Z_COMMA", 0.10)])

    N("CLAUSE_Z", [("Z_PRON", 0.45), ("Z_NAME", 0.15), ("Z_N_SUBJ", 0.15)])
    N("PRED_Z", [("Z_ADV", 0.2), ("Z_V", 0.45), ("Z_PREP", 0.1), ("Z_MOTION", 0.12)])
    L("Z_PRON", [("PRED_Z", 1)])
    L("Z_NAME", [("PRED_Z", 1)])
    L("Z_N_SUBJ", [("PRED_Z", 1)])
    L("Z_ADV", [("Z_V", 0.7), ("Z_MOTION", 0.3)])
    L("Z_PREP", [("Z_PLACE", 1)])
    L("Z_PLACE", [("Z_V", 1)])
    L("Z_MOTION", [("Z_PLACE_GOAL", 1)])
    L("Z_PLACE_GOAL", [("Z_PURPOSE", 0.6), ("CLAUSE_END_Z", 0.4)])
    L("Z_PURPOSE", [("CLAUSE_END_Z", 1)])
    L("Z_V", [("Z_ASP", 0.3), ("Z_OBJ", 0.5), ("Z_OBJ_EN", 0.05), ("CLAUSE_END_Z", 0.15)])
    L("Z_ASP", [("Z_OBJ", 0.8), ("Z_OBJ_EN", 0.05), ("CLAUSE_END_Z", 0.15)])
    L("Z_OBJ", [("CLAUSE_END_Z", 1)])
    L("Z_OBJ_EN", [("CLAUSE_END_Z", 1)])
    L("Z_COMMA", [("Z_CONJ", 1)])
    L("Z_CONJ", [("CLAUSE_Z", 0.9), ("CLAUSE_E", 0.1)])
    L("Z_PERIOD", [(END, 1)])

    for fr in frames:
        _add_frame(b, fr)
    lemmas = {
        f: v
        for v in verbs
        for f in [*_verb_forms(v).values(), "re" + _verb_forms(v)["past"], "re" + _verb_forms(v)["ing"]]
    }
    lemmas.update({f: n for n in nouns for f in (n, _plural(n))})
    lemmas.update({f: a for a in adjs for f in (a, _adverb(a), "un" + a)})
    return b.compile("SENTENCE", seed, max_len, lemmas)


def _shift_stems(rng: np.random.Generator, stems: list[str], taken: set[str], forms_of) -> list[str]:
    """Domain b's stems: :data:`DOMAIN_B_NEW_STEMS` of ``stems`` replaced by new ones, then
    all of them in a new (random) Zipf order."""
    stems = list(stems)
    n_new = round(len(stems) * DOMAIN_B_NEW_STEMS)
    for position, stem in zip(
        rng.choice(len(stems), n_new, replace=False).tolist(), _make_stems(rng, n_new, taken, forms_of)
    ):
        stems[position] = stem
    return [stems[i] for i in rng.permutation(len(stems)).tolist()]


def _shift_senses(frame: dict[str, Any]) -> dict[str, Any]:
    """Domain b's frame: the first sense weighs :data:`DOMAIN_B_FIRST_SENSE`, the others
    share the rest equally."""
    names = list(frame["senses"])
    rest = (1.0 - DOMAIN_B_FIRST_SENSE) / (len(names) - 1)
    senses = {
        name: ((DOMAIN_B_FIRST_SENSE if k == 0 else rest), *frame["senses"][name][1:]) for k, name in enumerate(names)
    }
    return {**frame, "senses": senses}


def _check_domain(domain: Any) -> str:
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(map(repr, DOMAINS))}, got {domain!r}")
    return domain


def random_language(
    seed: int, n_states: int = 3, n_words: int = 4, end_prob: float = 0.3, max_len: int | None = None
) -> SyntheticLanguage:
    """A small random HMM (every state emits every word) for tests of the scorer/sampler."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.ones(n_states), size=n_states) * (1 - end_prob)
    end = np.full(n_states, end_prob)
    return SyntheticLanguage(
        seed=seed,
        vocab=tuple(f"w{i}" for i in range(n_words)),
        state_names=tuple(f"s{i}" for i in range(n_states)),
        state_classes=tuple(f"C{i % 2}" for i in range(n_states)),
        state_senses=(None,) * n_states,
        start=rng.dirichlet(np.ones(n_states)),
        trans=trans,
        end=end,
        emit=rng.dirichlet(np.ones(n_words), size=n_states),
        polysemous={},
        max_len=max_len,
    )


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a non-negative integer, got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return int(seed)


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)
