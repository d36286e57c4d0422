"""The peer for tests/test_manylangs.py: HIT-SCIR's ELMoForManyLangs package itself.

Runs ONLY inside the separate environment that ``../shared/peers/elmoformanylangs-env.sh``
builds (torch + the package; never imported by the project or the test process)::

    PEER/bin/python -W ignore tests/peer_manylangs.py make FOLDER [--legacy] [--released-size | --equal-projection]
    PEER/bin/python -W ignore tests/peer_manylangs.py embed SENTENCES.json OUT.npz FOLDER...

``make`` builds a small model (``--released-size``: the released models' architecture, the
package's configs/cnn_50_100_512_4096_sample.json, with 3,000 chars and 30,000 words) with random weights with the package's own classes and saves
it as the package's loader expects (``--equal-projection``: word_dim + the filters' sum equal to
projection_dim, where the package still has its projection) (``torch.save`` of the two state dicts; ``--legacy``: the
pre-1.6 layout of the released 2018 files).  ``embed`` runs
``Embedder(FOLDER).sents2elmo(sentences, output_layer=k)`` for k = 0, 1, 2, -1, each from the
state of a fresh ``Embedder`` (its LSTM state carries over between calls: it is reset before
each), into ``OUT.npz`` (``{f}_k{k}_{i}`` for folder number ``f`` and sentence ``i``).
"""

import json
import logging
import os
import sys

import numpy as np
import torch
from elmoformanylangs import Embedder
from elmoformanylangs.frontend import Model
from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

ARCH = {
    "encoder": {"name": "elmo", "projection_dim": 16, "cell_clip": 3, "proj_clip": 3, "dim": 24, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 8], [2, 8], [3, 16]],
        "n_highway": 2,
        "word_dim": 6,
        "char_dim": 5,
        "max_characters_per_token": 20,
    },
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
# word_dim 8 + filters 16 = projection_dim 24: the package's projection is there all the same
EQUAL_PROJECTION = {
    **ARCH,
    "encoder": {**ARCH["encoder"], "projection_dim": 24, "dim": 32},
    "token_embedder": {**ARCH["token_embedder"], "word_dim": 8, "filters": [[1, 4], [2, 4], [3, 8]]},
}
CHARS = list("abcdefghijklmnopqrstuvwxyzéèàüöç中文字") + ["\u3000"]
WORDS = ["the", "cat", "sat", "on", "mat", "café", "中文", "a"]


logging.disable(logging.INFO)  # the package logs its whole model at INFO


def write_dic(path, entries):
    with open(path, "w", encoding="utf-8") as f:
        for i, token in enumerate(entries):
            # the package writes U+3000 as a line with the id only (its strip() eats it)
            f.write(f"{i}\n" if token == "\u3000" else f"{token}\t{i}\n")


def make(folder, legacy, released_size=False, equal_projection=False):
    torch.manual_seed(0)
    os.makedirs(folder, exist_ok=True)
    arch = EQUAL_PROJECTION if equal_projection else ARCH
    chars = ["<bow>", "<eow>", "<bos>", "<eos>", "<oov>", "<pad>"] + CHARS
    words = ["<oov>", "<pad>", "<bos>", "<eos>"] + WORDS
    if released_size:
        arch = {
            **ARCH,
            "encoder": {
                "name": "elmo",
                "projection_dim": 512,
                "cell_clip": 3,
                "proj_clip": 3,
                "dim": 4096,
                "n_layers": 2,
            },
            "token_embedder": {
                "name": "cnn",
                "activation": "relu",
                "n_highway": 2,
                "word_dim": 100,
                "char_dim": 50,
                "max_characters_per_token": 50,
                "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
            },
        }
        chars += [c for c in map(chr, range(0x4E00, 0x4E00 + 3000)) if c not in chars][: 3000 - len(chars)]
        words += [f"w{i}" for i in range(30000 - len(words))]
    write_dic(os.path.join(folder, "char.dic"), chars)
    write_dic(os.path.join(folder, "word.dic"), words)
    char2id = {c: i for i, c in enumerate(chars)}
    word2id = {w: i for i, w in enumerate(words)}
    char_layer = EmbeddingLayer(arch["token_embedder"]["char_dim"], char2id, fix_emb=False, embs=None)
    word_layer = EmbeddingLayer(arch["token_embedder"]["word_dim"], word2id, fix_emb=False, embs=None)
    model = Model(arch, word_layer, char_layer, False)
    with torch.no_grad():  # every weight and bias non-trivial, so each mapping is exercised
        for name, p in model.named_parameters():
            if not released_size:
                p.add_(0.3 * torch.randn_like(p))
            elif name.endswith("bias"):  # the package's own init, biases moved off their constants
                p.add_(0.1 * torch.randn_like(p))
    with open(os.path.join(folder, "cnn_test_arch.json"), "w") as f:
        json.dump(arch, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"config_path": "cnn_test_arch.json"}, f)
    kw = {} if not legacy else {"_use_new_zipfile_serialization": False}
    torch.save(model.token_embedder.state_dict(), os.path.join(folder, "token_embedder.pkl"), **kw)
    torch.save(model.encoder.state_dict(), os.path.join(folder, "encoder.pkl"), **kw)


def embed(sentences_path, out_path, folders):
    with open(sentences_path, encoding="utf-8") as f:
        sentences = json.load(f)
    out = {}
    for n, folder in enumerate(folders):
        embedder = Embedder(folder, batch_size=64)
        for k in (0, 1, 2, -1):
            embedder.model.encoder.reset_states()  # the state of a fresh Embedder
            for i, v in enumerate(embedder.sents2elmo(sentences, output_layer=k)):
                out[f"{n}_k{k}_{i}"] = np.asarray(v, np.float32)
    np.savez(out_path, **out)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], "--legacy" in sys.argv, "--released-size" in sys.argv, "--equal-projection" in sys.argv)
    elif cmd == "embed":
        embed(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(f"unknown command {cmd!r}")
