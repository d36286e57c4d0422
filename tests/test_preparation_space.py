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
    path.write_text("".join(" ".join(rng.choices(words, k=rng.randint(1, 3))) + "\n" for _ in range(20_000)),
                    encoding="utf-8")
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
