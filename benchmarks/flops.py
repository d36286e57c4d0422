"""Analytic FLOP counts per token for any ElmoConfig (multiply-add = 2 FLOPs).

Only the matmul/convolution work is counted; gate nonlinearities, clipping, highway gating,
max-pooling, embedding lookups and the optimizer's elementwise update are left out (for
``original`` they are < 0.1 % of the matmul FLOPs, but the optimizer update is memory bound
and does cost time; see README).

Per *real token* (one position of a sentence; markers and padding are not counted as tokens):

- char CNN: for each filter (width w, n maps) over ``C = max_characters_per_token`` chars,
  VALID: ``(C - w + 1) * 2 * w * D * n``
- highway: ``n_highway * 2 matmuls * 2 * F * F``
- projection (when F != P): ``2 * F * P``
- LSTM, per layer and direction: input ``2 * I * 4H`` + recurrent ``2 * P * 4H`` +
  projection ``2 * H * P`` (``I = P`` for every layer)
- sampled softmax, per direction: ``2 * P * (S + 1)`` (S negatives + the true logit)
- full softmax, per direction: ``2 * P * V``

Embedding (inference) = encoder once + LSTMs of both directions.
Training token (as bilm-tf counts them: batch * unroll_steps positions per step, each in a
forward stream AND a separate backward stream) = 2 encoder passes (one per stream) + LSTMs +
2 sampled softmaxes, and the backward pass costs ~2x the forward: x3 in all.
"""

from __future__ import annotations


def encoder_flops(config) -> dict[str, float]:
    c = config.char_cnn
    f = c.n_filters
    cnn = sum((c.max_characters_per_token - w + 1) * 2 * w * c.embedding_dim * n for w, n in c.filters)
    highway = c.n_highway * 2 * (2 * f * f)
    proj = 2 * f * config.projection_dim if config.has_char_projection else 0
    return {"char_cnn": float(cnn), "highway": float(highway), "projection": float(proj)}


def lstm_flops(config) -> dict[str, float]:
    l = config.lstm
    p, h = l.projection_dim, l.dim
    n = 2 * l.n_layers  # directions x layers
    return {
        "lstm_input": float(n * 2 * p * 4 * h),
        "lstm_recurrent": float(n * 2 * p * 4 * h),
        "lstm_projection": float(n * 2 * h * p),
    }


def softmax_flops(config, num_negatives: int | None = 8192, vocab_size: int | None = None) -> float:
    """Both directions. Sampled if ``num_negatives`` is given, else full over ``vocab_size``."""
    p = config.projection_dim
    if num_negatives is not None:
        return float(2 * 2 * p * (num_negatives + 1))
    return float(2 * 2 * p * vocab_size)


def breakdown(config, num_negatives: int = 8192) -> dict[str, float]:
    """Forward FLOPs per token by component, in the layout of ELMO.md section 4."""
    enc = encoder_flops(config)
    lstm = lstm_flops(config)
    out = {**enc, **lstm}
    out["lstm_total"] = sum(lstm.values())
    out["sampled_softmax"] = softmax_flops(config, num_negatives)
    out["encoder_total"] = sum(enc.values())
    out["embed_forward"] = out["encoder_total"] + out["lstm_total"]
    out["forward_with_sampled_softmax"] = out["embed_forward"] + out["sampled_softmax"]
    # Training: two streams -> two encoder passes; x3 for forward + backward.
    out["train_forward"] = 2 * out["encoder_total"] + out["lstm_total"] + out["sampled_softmax"]
    out["train_total"] = 3 * out["train_forward"]
    return out


def embed_flops_per_token(config) -> float:
    return breakdown(config)["embed_forward"]


def train_flops_per_token(config, num_negatives: int = 8192) -> float:
    return breakdown(config, num_negatives)["train_total"]


def format_breakdown(name: str, config, num_negatives: int = 8192) -> str:
    b = breakdown(config, num_negatives)
    m = {k: v / 1e6 for k, v in b.items()}
    return (
        f"{name:9s} MFLOP/token: char CNN {m['char_cnn']:.1f}, highway {m['highway']:.1f}, "
        f"projection {m['projection']:.1f}, LSTMs {m['lstm_total']:.1f} "
        f"(input {m['lstm_input']:.1f} + recurrent {m['lstm_recurrent']:.1f} + proj {m['lstm_projection']:.1f}), "
        f"sampled softmax ({num_negatives}) {m['sampled_softmax']:.1f} | "
        f"forward+sampled {m['forward_with_sampled_softmax']:.1f}, embedding {m['embed_forward']:.1f}, "
        f"training token (2 encoders, x3) {m['train_total']:.1f}"
    )


def weight_traffic_bound(config, length: int, bytes_per_s: float, dtype: str = "float32") -> float:
    """Tokens/s ceiling for embedding ONE sentence of ``length`` tokens from memory traffic.

    With one row the recurrence is a matrix-vector product per step: every one of the
    ``length + 2`` steps (``<S>``, ``</S>``) must stream the recurrent weights ``W_h [P, 4H]``
    and ``W_p [H, P]`` of every layer and direction from memory (when they do not fit in the cache).
    Everything else (char CNN, highway, projection, ``W_x``) is read once per call in float32;
    with ``bfloat16`` the recurrent weights are converted once (read 4 + write 2 bytes) and
    then streamed at 2 bytes each.
    """
    from elmo_jax.config import count_params

    recurrent = recurrent_weight_bytes(config) // 4
    once = count_params(config) - recurrent
    width = 2 if dtype == "bfloat16" else 4
    convert = 6 * recurrent if dtype == "bfloat16" else 0
    total = (length + 2) * recurrent * width + once * 4 + convert
    return length / (total / bytes_per_s)


def recurrent_weight_bytes(config) -> int:
    """float32 bytes of ``W_h`` and ``W_p`` over all layers and both directions."""
    l = config.lstm
    return 4 * l.n_layers * 2 * (l.projection_dim * 4 * l.dim + l.dim * l.projection_dim)


if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from elmo_jax.config import ElmoConfig

    for name in ("small", "medium", "original"):
        print(format_breakdown(name, ElmoConfig.preset(name)))
    b = breakdown(ElmoConfig.preset("original"))
    print(
        "original full softmax over 793,471 words adds "
        f"{softmax_flops(ElmoConfig.preset('original'), None, 793471) / 1e9:.2f} GFLOP/token"
    )
    assert abs(b["forward_with_sampled_softmax"] / 1e6 - 221) < 1.0, b
