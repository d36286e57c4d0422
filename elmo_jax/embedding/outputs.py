"""What ``embed`` hands back: the requested layers of a group (``all``, ``top``,
``average``, ``mix``), reduced on the devices, then cut into one host array per sentence."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.model.heads import scalar_mix

LAYER_MODES = ("all", "top", "average", "mix")


def check_layers(layers: str, mix_params: dict | None, n_layers: int) -> dict | None:
    """``layers`` checked, and ``mix_params`` as device arrays for ``"mix"`` (else ``None``)."""
    if layers not in LAYER_MODES:
        raise ValueError(f"layers must be one of {', '.join(LAYER_MODES)}, got {layers!r}")
    if layers == "mix":
        return check_mix_params(mix_params, n_layers)
    if mix_params is not None:
        raise ValueError('mix_params is only used with layers="mix"')
    return None


def check_mix_params(mix_params: dict | None, n: int) -> dict:
    if mix_params is None:
        raise ValueError(
            'layers="mix" needs mix_params={"scalars": [L+1], "gamma": scalar} '
            "(elmo_jax.model.heads.scalar_mix_init or a trained head)"
        )
    if not isinstance(mix_params, dict):
        raise ValueError(
            f'mix_params must be a dict {{"scalars": [L+1], "gamma": scalar}} '
            f"(elmo_jax.model.heads.scalar_mix_init or a trained head), got {type(mix_params).__name__}"
        )
    if "scalars" not in mix_params and isinstance(mix_params.get("mix"), dict):
        raise ValueError(
            'mix_params takes the ScalarMix itself: pass result.params["mix"] of a trained tagger, not the whole head'
        )
    if mix_params.get("layer_norm"):  # its statistics would be those of embed's padded groups
        raise ValueError(
            'mix_params["layer_norm"]: embed does not apply layer norm (its statistics come from a '
            'batch of sentences, and embed groups sentences by length); embed with layers="all" '
            "and apply scalar_mix(mix_params, layers, mask, layer_norm=True) to your batch, or "
            'elmo_jax.finetune.tagger_logits for a trained "mix:layer_norm" head'
        )
    unknown = sorted(set(mix_params) - {"scalars", "gamma", "layer_norm"}, key=str)
    if unknown:
        raise ValueError(
            f"mix_params has unknown key(s) {', '.join(map(repr, unknown))}; the valid ones are "
            f"'scalars' and 'gamma' (and 'layer_norm': False)"
        )
    scalars = np.asarray(mix_params.get("scalars"), np.float32)
    if scalars.shape != (n,):
        raise ValueError(f"mix_params['scalars'] must have shape ({n},), got {scalars.shape}")
    return {"scalars": jnp.asarray(scalars), "gamma": jnp.asarray(mix_params.get("gamma", 1.0), jnp.float32)}


def reduce_layers(layers_LBTD: jax.Array, layers: str, mix_params: dict | None) -> jax.Array:
    """``[L+1, B, T, D]`` for ``"all"``, else ``[B, T, D]``."""
    if layers == "all":
        return layers_LBTD
    if layers == "top":
        return layers_LBTD[-1]
    if layers == "average":
        return jnp.mean(layers_LBTD, axis=0)
    assert mix_params is not None  # "mix": check_layers gave the checked mix_params
    return scalar_mix(mix_params, layers_LBTD)


def split_rows(host_LBTD: np.ndarray, lengths: list[int], squeeze: bool) -> list[np.ndarray]:
    """Row ``r``'s first ``lengths[r]`` steps as its own C-contiguous ``[L, n, D]`` array
    (``[n, D]`` if ``squeeze``).  The arrays are slices of one buffer per group: a fresh
    allocation per sentence made every page of every sentence fault on first write
    (7-30 us per `original` token on the 2-core machine, against ~2 us this way)."""
    n_layers, _, _, dim = host_LBTD.shape
    per_step = n_layers * dim
    buf = np.empty(sum(lengths) * per_step, host_LBTD.dtype)
    out, start = [], 0
    for r, n in enumerate(lengths):
        a = buf[start : start + n * per_step].reshape(n_layers, n, dim)
        np.copyto(a, host_LBTD[:, r, :n])
        out.append(a[0] if squeeze else a)
        start += n * per_step
    return out


def empty_outputs(n: int, layers: str, n_layers: int, dim: int) -> list[np.ndarray]:
    """``n`` empty sentences' arrays: ``[L+1, 0, D]`` (or ``[0, D]``)."""
    shape = (n_layers, 0, dim) if layers == "all" else (0, dim)
    return [np.zeros(shape, np.float32) for _ in range(n)]
