"""The peer: AllenNLP's PyTorch ELMo biLM (``allennlp.modules.elmo._ElmoBiLm``).

Runs ONLY inside the separate peer environment (never imported by the project)::

    PYTHONPATH=PEER/stub PEER/bin/python -W ignore benchmarks/peer_allennlp.py embed ...

It loads the options.json + weights.hdf5 that ``run.py`` wrote with
``elmo_jax.formats.hdf5.save_weights``, so both sides run the same weights on the same sentences.
Output: one JSON line prefixed with ``RESULT ``.

``_ElmoBiLm`` is stateful (it carries LSTM states between calls); every call here starts from
zero state (``reset_states()`` before each forward), as ``elmo_jax`` does by default.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import numpy as np
import torch
from allennlp.modules.elmo import _ElmoBiLm, batch_to_ids
from allennlp.nn.util import remove_sentence_boundaries


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed_reps(fn, min_reps, min_time, max_reps):
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < min_time):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def load(model_dir: str, device: str) -> _ElmoBiLm:
    m = _ElmoBiLm(os.path.join(model_dir, "options.json"), os.path.join(model_dir, "weights.hdf5"))
    return m.to(device).eval()


def versions() -> dict:
    import allennlp.version

    return {"torch": torch.__version__, "allennlp": allennlp.version.VERSION, "torch_threads": torch.get_num_threads()}


def forward(model: _ElmoBiLm, ids: torch.Tensor):
    model._elmo_lstm.reset_states()
    with torch.no_grad():
        out = model(ids)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return out


def task_embed(args) -> dict:
    with open(args.sentences) as f:
        sents = json.load(f)["by_length"][str(args.length)][: args.batch]
    model = load(args.model_dir, args.device)
    rss_loaded = peak_rss_mb()
    ids = batch_to_ids(sents).to(args.device)
    assert tuple(ids.shape[:2]) == (args.batch, args.length), ids.shape
    t0 = time.perf_counter()
    forward(model, ids)
    first = time.perf_counter() - t0
    load_before = os.getloadavg()[0]
    times = timed_reps(lambda: forward(model, ids), args.min_reps, args.min_time, args.max_reps)
    med = statistics.median(times)
    n_tokens = sum(len(s) for s in sents)
    return {
        "batch": args.batch,
        "length": args.length,
        "tokens": n_tokens,
        "first_call_s": first,
        "times": times,
        "median_s": med,
        "tokens_per_s": n_tokens / med,
        "peak_rss_mb": peak_rss_mb(),
        "rss_after_load_mb": rss_loaded,
        "device": args.device,
        "load1_before": load_before,
        "load1_after": os.getloadavg()[0],
        **versions(),
    }


def task_agree(args) -> dict:
    with open(args.sentences) as f:
        sents = json.load(f)["agreement"]
    model = load(args.model_dir, "cpu")  # a fresh module: zero state
    out = forward(model, batch_to_ids(sents))
    layers = []
    for act in out["activations"]:
        x, mask = remove_sentence_boundaries(act, out["mask"])
        layers.append(x.numpy())
    stacked = np.stack(layers)  # [3, B, T, 2P]
    np.savez(args.out, **{str(i): stacked[:, i, : len(s)] for i, s in enumerate(sents)})
    return {"n": len(sents), "out": args.out, **versions()}


def task_info(args) -> dict:
    return {**versions(), "cuda": torch.cuda.is_available()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("task", choices=["embed", "agree", "info"])
    p.add_argument("--model-dir")
    p.add_argument("--sentences")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=20)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=20)
    p.add_argument("--min-time", type=float, default=2.0)
    p.add_argument("--out")
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    result = {"embed": task_embed, "agree": task_agree, "info": task_info}[args.task](args)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
