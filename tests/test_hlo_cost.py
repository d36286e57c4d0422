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


# A TPU program's shape: an HBM array prefetched into on-chip memory (S(1)), a fusion there
# and one writing its result back to HBM.
_ON_CHIP_HLO = """HloModule m

%add_parts (p0: f32[256], p1: f32[256]) -> f32[256] {
  %p0 = f32[256]{0} parameter(0)
  %p1 = f32[256]{0} parameter(1)
  ROOT %sum = f32[256]{0} add(%p0, %p1)
}

ENTRY %main (a: f32[256], b: f32[256]) -> f32[256] {
  %a = f32[256]{0} parameter(0)
  %b = f32[256]{0} parameter(1)
  %prefetch = (f32[256]{0}, f32[256]{0:S(1)}, u32[]{:S(2)}) copy-start(%a)
  %a_on_chip = f32[256]{0:S(1)} copy-done(%prefetch)
  %on_chip = f32[256]{0:S(1)} fusion(%a_on_chip, %b), kind=kLoop, calls=%add_parts
  ROOT %back = f32[256]{0} fusion(%on_chip, %on_chip), kind=kLoop, calls=%add_parts
}
"""


def test_on_chip_buffers_are_counted_apart_from_main_memory():
    """By default every buffer counts (the upper bound); ``on_chip=True`` counts in ``bytes``
    only HBM: the prefetch's read, ``b``, and the result written back (3 x 1 kB), and the 5 kB
    read and written in on-chip memory in ``on_chip_bytes``.  FLOPs are the same either way."""
    every, split = loop_aware_cost(_ON_CHIP_HLO), loop_aware_cost(_ON_CHIP_HLO, on_chip=True)
    assert every.bytes == 8 * 1024 and every.on_chip_bytes == 0
    assert split.bytes == 3 * 1024 and split.on_chip_bytes == 5 * 1024
    assert every.flops == split.flops == 2 * 256
    assert shape_elements_and_bytes("(f32[2]{0:S(1)}, f32[3]{0:S(0)}, bf16[4])", main_memory_only=True) == (9, 12 + 8)


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
    compiled = _costs((x, w))
    ours = {n: loop_aware_cost(c.as_text()) for n, c in compiled.items()}
    assert ours[40].flops == pytest.approx(2 * ours[20].flops, rel=0.01)
    assert ours[20].flops == pytest.approx(20 * 2 * 128 * 512 * 512, rel=0.01)
    # The weights stay on chip across the steps: split out, the same total
    split = loop_aware_cost(compiled[20].as_text(), on_chip=True)
    assert split.on_chip_bytes > 0 and split.bytes + split.on_chip_bytes == pytest.approx(ours[20].bytes)
    assert split.flops == ours[20].flops
