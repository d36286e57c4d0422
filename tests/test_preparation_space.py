"""The space a text preparation needs: the disk-full message's estimate bounds what a real
preparation writes (short lines cost ArrayRecord far more than their bytes), and a refused
preparation leaves no empty folder behind."""

import os
import random
import re

import pytest

from elmo_jax.data import text_source


def _full_disk(monkeypatch, workers):
    """Every shard write meets a full disk (as ArrayRecord words it)."""
    import tensorflow_datasets as tfds

    if workers:
        monkeypatch.setattr(text_source, "write_range", _full_disk_write_range)
    else:

        def full(cls, path, examples):
            raise RuntimeError(f"write() failed: No space left on device; writing {path}; at byte 0")

        monkeypatch.setattr(tfds.core.file_adapters.ArrayRecordFileAdapter, "write_examples", classmethod(full))


def _full_disk_write_range(path, start, stop, out):
    open(out, "wb").close()
    raise RuntimeError(f"write() failed: No space left on device; writing {out}; at byte 0")


def _bytes_under(folder):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, names in os.walk(folder) for f in names)


@pytest.fixture(scope="module")
def short_lines(tmp_path_factory):
    """20,000 lines of 1-3 tokens (12 bytes a line): ArrayRecord's framing is most of it."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 9))) for _ in range(3000)]
    path = tmp_path_factory.mktemp("text") / "short.txt"
    path.write_text(
        "".join(" ".join(rng.choices(words, k=rng.randint(1, 3))) + "\n" for _ in range(20_000)), encoding="utf-8"
    )
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_the_disk_full_estimate_bounds_a_real_preparation(short_lines, tmp_path, monkeypatch, workers):
    text_source.prepare_local_text(str(short_lines), tmp_path / "real", workers=workers)
    real = _bytes_under(tmp_path / "real")
    assert real > 5 * os.path.getsize(short_lines)  # what the text's size alone missed
    _full_disk(monkeypatch, workers)
    with pytest.raises(text_source.DataDiskFullError) as raised:
        text_source.prepare_local_text(str(short_lines), tmp_path / "full", workers=workers)
    needed_mib = float(re.search(r"needs about ([\d.]+) MiB", str(raised.value)).group(1))
    assert real / 2**20 - 0.05 <= needed_mib <= 1.3 * real / 2**20, (needed_mib, real / 2**20)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_refused_preparation_leaves_no_empty_folder(tmp_path, monkeypatch, workers):
    text = tmp_path / "corpus.txt"
    text.write_text("the bank of the river\na b c\n" * 50, encoding="utf-8")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "other_dataset").mkdir()  # what was there before stays
    # A refusal of the text: a data_dir that the preparation made goes as well.
    (tmp_path / "bad.txt").write_bytes(b"fine\ncaf\xe9\n")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        text_source.prepare_local_text(str(tmp_path / "bad.txt"), tmp_path / "new", workers=workers)
    assert not (tmp_path / "new").exists()
    _full_disk(monkeypatch, workers)
    with pytest.raises(text_source.DataDiskFullError):
        text_source.prepare_local_text(str(text), tmp_path / "data", workers=workers)
    assert sorted(p.name for p in (tmp_path / "data").rglob("*")) == ["other_dataset"]


# ==========================================================================================
# A step that cannot fit is refused before the data is prepared, indexed and counted
# ==========================================================================================


@pytest.mark.parametrize("what", ["batch_size", "dim"])
def test_a_step_that_cannot_fit_is_refused_before_anything_is_built(tmp_path, monkeypatch, what):
    from elmo_jax.train import loop
    from elmo_jax.train.memory import MemoryEstimateError
    from tests.test_train import _cfg

    cfg = _cfg(tmp_path, data_dir=None)  # the text is prepared beside the run, in WORKDIR/tfds
    cfg = (
        cfg.replace(batch_size=10**9)
        if what == "batch_size"
        else cfg.replace(model_overrides={**cfg.model_overrides, "dim": 10**8})
    )

    def no_preparation(*args, **kwargs):
        raise AssertionError("the data was prepared before the step's memory was checked")

    monkeypatch.setattr(loop, "prepare_data", no_preparation)
    with pytest.raises(MemoryEstimateError, match="the training step needs at least"):
        loop.train(cfg, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()  # no tfds/, token_index/, vocab.txt


def test_the_softmax_is_still_checked_once_the_vocabulary_is_known(tmp_path, monkeypatch):
    """A step that fits with the fewest targets but not with the built vocabulary's."""
    from elmo_jax.train import loop
    from elmo_jax.train.memory import MemoryEstimateError
    from tests.test_train import _cfg

    sizes = []
    real_check = loop.check_step_memory

    def recording(cfg, model_config, vocab_size, *args):
        sizes.append(vocab_size)
        if vocab_size > 3:
            raise MemoryEstimateError(f"vocabulary of {vocab_size} does not fit")
        real_check(cfg, model_config, vocab_size, *args)

    monkeypatch.setattr(loop, "check_step_memory", recording)
    with pytest.raises(MemoryEstimateError, match="does not fit"):
        loop.train(_cfg(tmp_path), str(tmp_path / "run"), progress=False)
    assert sizes[0] == 3 and sizes[1] > 3 and len(sizes) == 2
