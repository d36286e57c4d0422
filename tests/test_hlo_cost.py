"""Loop-aware FLOPs and bytes of compiled programs (XLA's cost analysis counts a loop body once)."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.train.hlo_cost import loop_aware_cost, parse_hlo, shape_elements_and_bytes


def _scan(n):
    def f(x_BD, w_DD):
        def body(c, _):
            return jnp.tanh(c @ w_DD), None

        return jax.lax.scan(body, x_BD, None, length=n)[0]

    return f


def _costs(args):
    return {n: jax.jit(_scan(n)).lower(*args).compile() for n in (20, 40)}


def test_a_scan_of_40_steps_costs_twice_a_scan_of_20():
    compiled = _costs((jnp.zeros((64, 256)), jnp.zeros((256, 256))))
    ours = {n: loop_aware_cost(c.as_text()) for n, c in compiled.items()}
    matmul = 2 * 64 * 256 * 256
    assert ours[20].loops[0][1] == 20 and ours[40].loops[0][1] == 40 and ours[20].unknown_trip_counts == 0
    assert ours[40].flops == pytest.approx(2 * ours[20].flops, rel=0.01)
    assert ours[40].bytes == pytest.approx(2 * ours[20].bytes, rel=0.05)
    assert ours[20].flops == pytest.approx(20 * matmul, rel=0.01)
    # the trap: XLA's own count is the same for both
    xla = {n: c.cost_analysis()["flops"] for n, c in compiled.items()}
    assert xla[20] == xla[40]


def test_loop_free_program_matches_xla_count():
    c = jax.jit(lambda x, w: jnp.tanh(x @ w)).lower(jnp.zeros((64, 256)), jnp.zeros((256, 128))).compile()
    ours, xla = loop_aware_cost(c.as_text()), c.cost_analysis()
    assert ours.flops == pytest.approx(xla["flops"], rel=0.01)
    assert ours.bytes == pytest.approx(xla["bytes accessed"], rel=0.01)


def test_shapes_and_parse():
    assert shape_elements_and_bytes("(s32[], f32[2,3]{1,0}, bf16[4])") == (1 + 6 + 4, 4 + 24 + 8)
    with pytest.raises(ValueError, match="ENTRY"):
        parse_hlo("HloModule m\n")


@pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install 'elmo-jax[tpu]'): no compile-only TPU devices",
)
def test_scan_trip_counts_on_compile_only_tpu():
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.asarray(topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4").devices), ("data",))
    x = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    w = jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=NamedSharding(mesh, P()))
    ours = {n: loop_aware_cost(c.as_text()) for n, c in _costs((x, w)).items()}
    assert ours[40].flops == pytest.approx(2 * ours[20].flops, rel=0.01)
    assert ours[20].flops == pytest.approx(20 * 2 * 128 * 512 * 512, rel=0.01)
