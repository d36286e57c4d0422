"""``Elmo`` on several devices: the same results as one device for every output kind, rows
split over the mesh, a bounded number of compiles, and ``ElmoLayer`` / on-the-fly
fine-tuning fed a batch sharded by rows.

Devices are emulated on the CPU (``--xla_force_host_platform_device_count``), which must be
set before jax is imported, so each check runs in a subprocess.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import device_env

EMBED = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    from elmo_jax import Elmo
    from elmo_jax.model.heads import scalar_mix_init

    n = int(sys.argv[1])
    assert jax.local_device_count() == n, jax.devices()
    many = Elmo.random("tiny", seed=3, batch_size=8)
    one = Elmo(many.config, many.params, batch_size=8, devices=1)
    out = {"devices": [d.id for d in many.devices], "one_devices": [d.id for d in one.devices]}
    rng = np.random.default_rng(0)
    words = ["the", "bank", "river", "of", "she", "went", "to", "money", "银行", "x" * 60]
    sents = [" ".join(rng.choice(words, size=int(k))) for k in rng.integers(0, 5, size=19)] + ["", "a b"]
    diffs = {}

    def diff(a, b):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.shape == y.shape, (x.shape, y.shape)
        return max(float(np.abs(x - y).max()) if x.size else 0.0 for x, y in zip(a, b))

    mix = jax.tree.map(np.asarray, scalar_mix_init(many.config.n_output_layers))
    mix["scalars"] = np.asarray([0.3, -0.2, 0.5], np.float32)
    for layers in ("all", "top", "average", "mix"):
        kw = {"mix_params": mix} if layers == "mix" else {}
        diffs[layers] = diff(many.embed(sents, layers, **kw), one.embed(sents, layers, **kw))
    diffs["sentence_vectors"] = diff(many.sentence_vectors(sents), one.sentence_vectors(sents))
    diffs["small_batch"] = diff(many.embed(sents, batch_size=3), one.embed(sents, batch_size=3))
    # The carried state: two stateful calls (the second continues the first), then a smaller batch.
    stateful = []
    for e in (many, one):
        e.reset_state()
        stateful.append(e.embed(sents[:8], stateful=True) + e.embed(sents[8:16], stateful=True)
                        + e.embed(sents[16:19], stateful=True, batch_size=3))
    diffs["stateful"] = diff(*stateful)
    spec = jax.tree.leaves(many._states.carried)[0].sharding.spec
    out["carried_spec"] = [s for s in spec]
    # The token cache (some words cached, the rest encoded per group).
    for e in (many, one):
        e.cache_vocabulary(["the", "bank", "river", "银行"])
    diffs["token_cache"] = diff(many.embed(sents), one.embed(sents))
    out["cache_lstm_shapes"] = sorted(s[1] for s in many.compiled_cache_shapes if s[0] == "lstm")
    out["diffs"] = diffs
    out["row_buckets"] = sorted({r for r, _ in many.compiled_shapes})
    out["n_shapes"], out["bound"] = len(many.compiled_shapes), many.max_compiled_shapes(60)
    out["forward_executables"] = many._forward._cache_size()
    out["param_spec"] = [list(jax.tree.leaves(many.params)[0].sharding.spec),
                         len(jax.tree.leaves(many.params)[0].sharding.device_set)]
    ids = many.put_rows(np.zeros((2 * n, 5), np.int32))
    out["row_shards"] = sorted(s.data.shape[0] for s in ids.addressable_shards)
    # Choosing devices.
    out["two"] = [d.id for d in Elmo(many.config, many.params, batch_size=8, devices=2).devices]
    out["listed"] = [d.id for d in Elmo(many.config, many.params, devices=[jax.local_devices()[-1]]).devices]
    errors = []
    for bad in (0, n + 1, [], "cpu"):
        try:
            Elmo(many.config, many.params, devices=bad)
        except (ValueError, TypeError) as e:
            errors.append(str(e))
    out["errors"] = errors
    # The command line: every device by default, or those that --devices names.
    import contextlib, io, os, tempfile
    from elmo_jax import read_embeddings
    from elmo_jax.cli import main
    tmp = tempfile.mkdtemp()
    src = os.path.join(tmp, "in.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write("\\n".join(s or "x" for s in sents) + "\\n")
    cli = {}
    for flag in ("all", "1", "id:1,%d" % (n - 1)):
        dst, said = os.path.join(tmp, flag.replace(":", "_") + ".hdf5"), io.StringIO()
        with contextlib.redirect_stdout(said):
            rc = main(["embed", src, dst, "--top", "--preset", "tiny", "--seed", "3", "--no-progress",
                       *(["--devices", flag] if flag != "all" else [])])
        with read_embeddings(dst) as r:
            cli[flag] = (rc, said.getvalue(), [np.asarray(r[i]) for i in range(len(r))])
    out["cli_said"] = {k: v[1] for k, v in cli.items()}
    out["cli_rc"] = [v[0] for v in cli.values()]
    out["cli_diff"] = max(diff(cli["all"][2], v[2]) for v in cli.values())
    cli_errors = io.StringIO()
    with contextlib.redirect_stderr(cli_errors):
        out["cli_bad_rc"] = [main(["embed", src, os.path.join(tmp, "bad.hdf5"), "--top", "--preset", "tiny",
                                   "--devices", bad]) for bad in (str(n + 1), "id:%d" % n, "two", "id:1,1")]
    out["cli_errors"] = cli_errors.getvalue()
    out["cli_bad_left"] = sorted(p for p in os.listdir(tmp) if p.startswith("bad"))
    print(json.dumps(out))
    """
)

TASK = textwrap.dedent(
    """
    import json
    import jax, numpy as np, optax
    from flax import nnx
    from elmo_jax import Elmo
    from elmo_jax.finetune import init_tagger, make_train_step
    from elmo_jax.nnx import ElmoLayer, batch_inputs

    assert jax.local_device_count() == 4
    many = Elmo.random("tiny", seed=5, batch_size=8)
    one = Elmo(many.config, many.params, batch_size=8, devices=1)
    sents = ["the bank of the river", "she went", "a b c d e f", "x", "money money", "to the bank", "of", "river"]
    ids, mask = batch_inputs(sents, many.config, rows=8)
    out = {}
    # The task model's batch split by rows over the Elmo's devices; its weights replicated.
    ids_d, mask_d = many.put_rows((ids, mask))
    run = nnx.jit(lambda m, x, k: m(x, k, deterministic=True))
    got = run(ElmoLayer(many, num_output_representations=2, rngs=nnx.Rngs(0)), ids_d, mask_d)
    want = run(ElmoLayer(one, num_output_representations=2, rngs=nnx.Rngs(0)), ids, mask)
    out["nnx_diff"] = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(got, want))
    out["nnx_out_shards"] = len(got[0].sharding.device_set)
    # One on-the-fly fine-tuning step: same loss and head update.
    head = init_tagger(jax.random.key(0), many.config, 3, "mix")
    opt = optax.adam(1e-2)
    step = make_train_step("mix", opt, config=many.config, on_the_fly=True)
    labels = np.where(mask, np.arange(ids.shape[1])[None] % 3, -1).astype(np.int32)
    batch = {"char_ids": ids, "lengths": mask.sum(1).astype(np.int32), "labels": labels, "mask": mask}
    p1, _, l1, _ = step(head, opt.init(head), many.put_rows(batch), bilm_params=many.params)
    p0, _, l0, _ = step(head, opt.init(head), batch, bilm_params=one.params)
    out["loss_diff"] = abs(float(l1) - float(l0))
    out["head_diff"] = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                           for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p0)))
    out["moved"] = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                       for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(head)))
    print(json.dumps(out))
    """
)


def _run(script: str, devices: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", script, str(devices)],
        env=device_env(devices),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.fidelity
@pytest.mark.parametrize("devices", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_every_device_gives_one_devices_results(devices):
    out = _run(EMBED, devices)
    assert out["devices"] == list(range(devices)) and out["one_devices"] == [0]
    for kind, d in out["diffs"].items():
        assert d <= 1e-6, (kind, out["diffs"])
    # Rows split over the mesh: parameters replicated, groups and the carried state by rows.
    assert out["param_spec"] == [[], devices]
    assert out["carried_spec"][:3] == [None, None, "rows"] and not any(out["carried_spec"][3:]), out
    assert out["row_shards"] == [2] * devices
    assert all(r % devices == 0 for r in out["row_buckets"] + out["cache_lstm_shapes"]), out
    # Compiles stay bounded: one executable per (rows, time), within the documented bound.
    assert out["n_shapes"] <= out["bound"] and out["forward_executables"] == out["n_shapes"], out
    assert out["two"] == [0, 1] and out["listed"] == [devices - 1]
    assert len(out["errors"]) == 4, out["errors"]
    assert f"give 1..{devices} or None" in out["errors"][0] and "holds no device" in out["errors"][2]
    assert "devices must be None" in out["errors"][3]
    # elmo-jax embed --devices: every device by default, the same vectors on any of them.
    assert out["cli_rc"] == [0, 0, 0] and out["cli_diff"] <= 1e-6, out
    assert [f"on {k} device(s)" in said for k, said in zip((devices, 1, 2), out["cli_said"].values())] == [True] * 3
    assert out["cli_bad_rc"] == [2, 2, 2, 2] and out["cli_bad_left"] == [], (out["cli_errors"], out["cli_bad_left"])
    assert (
        f"--devices {devices + 1}: this process has {devices} local cpu device(s); give 1..{devices}, or all"
        in out["cli_errors"]
        and f"no local device has id {devices}" in out["cli_errors"]
    )
    assert "--devices 'two': give 'all'" in out["cli_errors"]
    assert "--devices id:1,1: a device id is listed twice" in out["cli_errors"]


def test_task_model_shards_its_batch_over_the_elmo_devices():
    out = _run(TASK, 4)
    assert out["nnx_diff"] <= 1e-6 and out["nnx_out_shards"] == 4, out
    assert out["loss_diff"] <= 1e-6 and out["head_diff"] <= 1e-6 and out["moved"] > 1e-4, out
