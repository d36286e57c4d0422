"""Task heads over frozen ELMo layers: pure functions with their own parameters.

* :func:`scalar_mix` — the paper's head: ``gamma * sum_j softmax(s)_j * h_j``, optionally
  layer-normalising each layer first (mean and variance over the unmasked tokens and all
  features of that layer).
* :func:`component_head` — the components head: the ``1 + 2L`` components (token layer,
  forward layers 1..L, backward layers 1..L; each ``P`` wide) concatenated per token and
  multiplied by one trainable ``[(1 + 2L) P, out_dim]`` matrix (``out_dim`` 512 by default).

Both take ``layers [L+1, B, T, 2P]`` as :func:`elmo_jax.model.bilm.bilm` returns them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from elmo_jax.config import ElmoConfig


def scalar_mix_init(n_layers: int, gamma: float = 1.0) -> dict:
    """Equal layer weights (``s = 0``) and ``gamma``."""
    return {"scalars": jnp.zeros((n_layers,), jnp.float32), "gamma": jnp.asarray(gamma, jnp.float32)}


def scalar_mix(
    params: dict,
    layers_LBTD: jax.Array,
    mask_BT: jax.Array | None = None,
    layer_norm: bool = False,
    eps: float = 1e-12,
) -> jax.Array:
    """``[L, B, T, D] -> [B, T, D]``: the softmax-weighted sum of the layers, times gamma.

    Any middle axes work the same way (one sentence ``[L, T, D] -> [T, D]``); ``mask_BT``
    has the middle axes' shape and only matters with ``layer_norm``."""
    if layers_LBTD.shape[0] != params["scalars"].shape[0]:
        raise ValueError(
            f"scalar_mix has {params['scalars'].shape[0]} layer weights but the layers' first axis has "
            f"{layers_LBTD.shape[0]}: layers go first ([L+1, B, T, D]; np.stack of embed() output is "
            f"[B, L+1, T, D]), and the weights must come from scalar_mix_init(L+1) of the same model"
        )
    weights_L = jax.nn.softmax(params["scalars"])
    if layer_norm:
        if mask_BT is None:
            mask_BT = jnp.ones(layers_LBTD.shape[1:-1], jnp.float32)
        m = mask_BT.astype(jnp.float32)[None, ..., None]
        axes = tuple(range(1, layers_LBTD.ndim))
        count = jnp.maximum(jnp.sum(m) * layers_LBTD.shape[-1], 1.0)
        mean_L = jnp.sum(layers_LBTD * m, axis=axes, keepdims=True) / count
        var_L = jnp.sum(((layers_LBTD - mean_L) * m) ** 2, axis=axes, keepdims=True) / count
        layers_LBTD = (layers_LBTD - mean_L) / jnp.sqrt(var_L + eps)
    return params["gamma"] * jnp.einsum("l,l...->...", weights_L, layers_LBTD)


def scalar_mix_penalty(params: dict) -> jax.Array:
    """The paper's L2 regulariser on the layer weights, ``sum(s ** 2)``: large values pull
    the mix toward a plain average."""
    return jnp.sum(params["scalars"] ** 2)


def n_components(config: ElmoConfig) -> int:
    return 1 + 2 * config.lstm.n_layers


def component_head_init(key: jax.Array, config: ElmoConfig, out_dim: int = 512) -> dict:
    """One ``[(1 + 2L) P, out_dim]`` matrix, Glorot-uniform."""
    n_in = n_components(config) * config.projection_dim
    bound = (6.0 / (n_in + out_dim)) ** 0.5
    return {"w": jax.random.uniform(key, (n_in, out_dim), minval=-bound, maxval=bound)}


def components(layers_LBTD: jax.Array) -> jax.Array:
    """``[L+1, B, T, 2P] -> [B, T, (1 + 2L) P]``: token, forward 1..L, backward 1..L."""
    p = layers_LBTD.shape[-1] // 2
    token = layers_LBTD[0, ..., :p]
    forward = [layers_LBTD[n, ..., :p] for n in range(1, layers_LBTD.shape[0])]
    backward = [layers_LBTD[n, ..., p:] for n in range(1, layers_LBTD.shape[0])]
    return jnp.concatenate([token, *forward, *backward], axis=-1)


def component_head(params: dict, layers_LBTD: jax.Array) -> jax.Array:
    """``[L+1, B, T, 2P] -> [B, T, out_dim]``: the concatenated components times one matrix."""
    x = components(layers_LBTD)
    if x.shape[-1] != params["w"].shape[0]:
        raise ValueError(
            f"component_head expects {params['w'].shape[0]} input features, the layers give "
            f"{x.shape[-1]}: layers go first ([L+1, B, T, 2P]; np.stack of embed() output is "
            f"[B, L+1, T, 2P]), and the head must be initialised with the model's ElmoConfig"
        )
    return x @ params["w"]
