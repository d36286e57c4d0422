"""The measured example of README "Models in other languages": an ELMoForManyLangs model of the
released architecture (made with random weights by ``tests/peer_manylangs.py make DIR --legacy
--released-size`` in the package's own environment) converted, loaded and used here.

    ELMO_JAX_HOME=/tmp/h python benchmarks/manylangs_example.py MODEL_DIR SENTENCES.json OUT.npz

Prints the first load (the conversion into the cache), a second load (the cached HDF5) and the
time of embedding 64 sentences of 20 tokens, as wall seconds and as this process's CPU seconds
(which mean more on a shared machine); writes the layers of SENTENCES.json to OUT.npz (``"i"``:
``[3, n_tokens, 1024]``) for a comparison with the package's own outputs.
"""

import json
import resource
import sys
import time

import numpy as np

from elmo_jax import Elmo


def timed(what: str, fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    print(f"{what}: wall {time.perf_counter() - wall:.1f} s, cpu {time.process_time() - cpu:.1f} s")
    return out


def main(model_dir: str, sentences_path: str, out_path: str) -> None:
    timed("first load (convert into the cache)", lambda: Elmo.load(model_dir))
    elmo = timed("second load (the cached HDF5)", lambda: Elmo.load(model_dir))
    with open(sentences_path, encoding="utf-8") as f:
        sentences = json.load(f)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(4, 30000)] + ["中文", "漢字", "über", "naïve", "unknownword"]
    batch = [[words[j] for j in rng.integers(0, len(words), 20)] for _ in range(64)]
    timed("first embed of 64 x 20 tokens (compiles)", lambda: elmo.embed(batch))
    for _ in range(3):
        timed("embed 64 sentences x 20 tokens", lambda: elmo.embed(batch))
    layers = elmo.embed(sentences, layers="all")
    np.savez(out_path, **{str(i): x for i, x in enumerate(layers)})
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main(*sys.argv[1:4])
