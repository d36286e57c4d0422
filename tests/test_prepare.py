"""Local text prepared in parallel processes (elmo_jax.data.text_shards): the same dataset as
the one-process TFDS builder, read back unchanged, and never a half-prepared one."""

import os
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from elmo_jax.data import example_proto, text_shards
from elmo_jax.data import text_source as ts
from elmo_jax.data.prefetch import DataWorkerError
from elmo_jax.textio import TextEncodingError

# Every hard case of line splitting: a byte-order mark, blank and whitespace-only lines,
# CRLF, multi-byte UTF-8 (2, 3 and 4 bytes), a tab, a run of blank lines, no final newline.
TRICKY = (
    "\ufeffthe cat sat .\n\n   \r\nle  café  \tnoir\r\n日本語 の 文\n\n\n"
    "emoji 🙂 ok\r\n\r\nx\nlast line without newline"
).encode("utf-8")


def _reference(data: bytes) -> tuple[bytes, int, int]:
    """What the one-process path hashes and counts: (content, sentences, tokens)."""
    content, n, tokens = b"", 0, 0
    for lineno, raw in enumerate(data.splitlines(keepends=True), start=1):
        words = ts.decode_line(raw, "ref", lineno).split()
        if words:
            content += " ".join(words).encode("utf-8") + b"\n"
            n += 1
            tokens += len(words)
    return content, n, tokens


def _ranges_content(path: Path, cuts: list[int], tmp: Path) -> tuple[bytes, int, int]:
    bounds = [0, *cuts, path.stat().st_size]
    content, n, tokens = b"", 0, 0
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        r = text_shards.write_range(str(path), a, b, str(tmp / f"shard{k}"))
        content += r["content"]
        n += r["num_sentences"]
        tokens += r["num_tokens"]
    return content, n, tokens


def test_text_example_is_what_tfds_serializes():
    features = tfds.features.FeaturesDict({"text": tfds.features.Text()})
    for text in ["", "a", "x" * 127, "y" * 128, "é " * 100, "z" * 20_000, "q" * 2_100_000]:
        record = example_proto.text_example(text.encode("utf-8"))
        assert record == features.serialize_example({"text": text}), len(text)
        assert example_proto.example_text(record) == text.encode("utf-8")


def test_every_cut_point_gives_the_lines_once_and_in_order(tmp_path):
    """A line belongs to the range its first byte lies in: cutting the file at any byte
    (inside CRLF, inside a multi-byte character, on a blank line) changes nothing."""
    path = tmp_path / "tricky.txt"
    path.write_bytes(TRICKY)
    expected = _reference(TRICKY)
    assert expected[1] == 6
    for cut in range(len(TRICKY) + 1):
        assert _ranges_content(path, [cut], tmp_path) == expected, cut
    for cuts in ([1, 2, 3], [5, 6, 40, 41, 42], list(range(0, len(TRICKY), 7))):
        assert _ranges_content(path, cuts, tmp_path) == expected, cuts


def test_text_taken_as_it_is_is_exactly_the_normalized_text():
    """The shortcut for blocks already in normal form agrees with str.split() on every
    character Python knows, anywhere in a line."""
    import sys

    def normal(text):
        return all(" ".join(line.split()) == line for line in text.split("\n"))

    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        ch = chr(code)
        for text in ("a" + ch + "b", ch + "a\nb"):
            assert text_shards._is_normal(text) == normal(text), hex(code)
    for text in [
        "a",
        "a b\nc",
        "",
        "\n\n",
        " ",
        "a  b",
        " a",
        "a ",
        "a\n b",
        "a \nb",
        "a\tb",
        "a\r\nb",
        "a\u3000b",
        "a\u00a0b",
        "x\n\ny z\n",
    ]:
        assert text_shards._is_normal(text) == normal(text), repr(text)


def test_byte_ranges_cover_the_files_in_order():
    sizes = [0, 10, 300 << 20, 5 << 20]
    ranges = text_shards.byte_ranges(sizes, 4)
    for i, size in enumerate(sizes):
        mine = [(a, b) for j, a, b in ranges if j == i]
        assert mine[0][0] == 0 and mine[-1][1] == size
        assert all(b1 == a2 for (_, b1), (a2, _) in zip(mine, mine[1:]))
    assert [j for j, _, _ in ranges] == sorted(j for j, _, _ in ranges)
    assert max(b - a for _, a, b in ranges) <= 16 << 20


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    files = [root / "a.txt", root / "b.txt", root / "c.txt", root / "blank.txt"]
    files[0].write_bytes(TRICKY)
    files[1].write_bytes("\n".join(f"s{i} {'w ' * (i % 5)}ü{i}" for i in range(300)).encode("utf-8") + b"\n")
    files[2].write_bytes(b"only line")
    files[3].write_bytes(b"\n\n  \r\n")  # no sentence: its shard is dropped
    return files


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory):
    return ts.LocalTextSource([str(f) for f in corpus], tmp_path_factory.mktemp("serial"))


def _parallel(corpus, data_dir, monkeypatch, workers=2, chunk=64):
    monkeypatch.setattr(text_shards, "_CHUNK_MIN", chunk)  # many small ranges
    return ts.LocalTextSource([str(f) for f in corpus], data_dir, workers=workers)


def test_parallel_preparation_is_the_one_process_dataset(corpus, one_process, tmp_path, monkeypatch):
    src = _parallel(corpus, tmp_path / "tfds", monkeypatch)
    assert src.prepared_now
    assert list(src) == list(one_process)
    assert len(src) == len(one_process) == 6 + 300 + 1
    assert src.content_id() == one_process.content_id()
    stats = ["files", "num_sentences", "num_tokens", "content_sha256"]
    assert {k: src.info[k] for k in stats} == {k: one_process.info[k] for k in stats}
    assert src.info["worker_cpu_s"] > 0
    assert src.num_tokens() == one_process.num_tokens()
    assert src.get_batch([306, 0, 7]) == one_process.get_batch([306, 0, 7])
    # Many shards, TFDS's names, no empty one, no leftover part file or incomplete folder.
    folder = Path(src.builder.data_dir)
    shards = sorted(p.name for p in folder.iterdir() if ".array_record-" in p.name)
    n = len(shards)
    assert n > 4
    assert shards == [f"elmo_local_text-train.array_record-{i:05d}-of-{n:05d}" for i in range(n)]
    assert sorted(set(os.listdir(folder)) - set(shards)) == [
        "dataset_info.json",
        "elmo_jax_ready.json",
        "features.json",
    ]
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]
    assert folder.stat().st_mode & 0o777 == Path(one_process.builder.data_dir).stat().st_mode & 0o777
    # TFDS reads it from its own metadata alone.
    builder = tfds.builder_from_directory(str(folder))
    assert builder.info.splits["train"].num_examples == len(src)
    assert all(n > 0 for n in builder.info.splits["train"].shard_lengths)
    ds = builder.as_data_source(split="train")
    assert [ds[i]["text"].decode("utf-8").split() for i in range(len(ds))] == list(one_process)
    # A second open reuses it, whatever the worker count.
    again = ts.LocalTextSource([str(f) for f in corpus], tmp_path / "tfds", workers=0)
    assert not again.prepared_now and again.content_id() == one_process.content_id()


def test_one_worker_and_one_range_per_file(corpus, one_process, tmp_path, monkeypatch):
    src = _parallel(corpus, tmp_path / "tfds", monkeypatch, workers=1, chunk=1 << 20)
    assert list(src) == list(one_process) and src.content_id() == one_process.content_id()
    assert src.info["num_tokens"] == one_process.info["num_tokens"]


def _no_dataset(data_dir: Path) -> None:
    """Nothing under data_dir that a later call could take as prepared."""
    leftovers = [p for p in data_dir.rglob("*") if p.is_file()]
    assert leftovers == [], leftovers


def test_a_failing_worker_leaves_no_dataset(tmp_path, monkeypatch):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok line\n" * 50 + b"caf\xe9 latin-1\n" + b"more\n" * 10)
    with pytest.raises(TextEncodingError, match=r"bad.txt, line 51: not valid UTF-8"):
        _parallel([bad], tmp_path / "tfds", monkeypatch)
    _no_dataset(tmp_path / "tfds")
    with pytest.raises(ValueError, match="empty corpus"):
        _parallel([_blank(tmp_path)], tmp_path / "tfds2", monkeypatch)
    _no_dataset(tmp_path / "tfds2")


def _blank(tmp_path: Path) -> Path:
    path = tmp_path / "blank.txt"
    path.write_bytes(b"\n \n\r\n")
    return path


def test_an_interrupted_preparation_is_not_taken_as_prepared(corpus, one_process, tmp_path, monkeypatch):
    """Interrupted after some ranges are written (Ctrl-C in the parent): the partial folder
    is removed, and the next call prepares the whole dataset again."""
    calls = []

    def interrupt(self, data):
        calls.append(len(data))
        if len(calls) == 3:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(ts.ContentDigest, "add_text", interrupt)
        with pytest.raises(KeyboardInterrupt):
            _parallel(corpus, tmp_path / "tfds", m)
    _no_dataset(tmp_path / "tfds")
    src = _parallel(corpus, tmp_path / "tfds", monkeypatch)
    assert src.prepared_now and list(src) == list(one_process)
    assert src.content_id() == one_process.content_id()


def test_the_run_prepares_with_data_workers(tmp_path):
    """run_data hands TrainConfig.data_workers to the source it opens (train and held-out)."""
    from elmo_jax.train.config_loader import TrainConfig
    from elmo_jax.train.run_data import prepare_data

    seen = []

    class Stop(Exception):
        pass

    def open_source(spec, split, data_dir, **kw):
        seen.append((split, kw.get("workers")))
        if split == "test":
            raise Stop
        return ts.InMemorySource(["a b"])

    text = tmp_path / "t.txt"
    text.write_text("a b\n")
    cfg = TrainConfig(data=str(text), heldout=str(text), data_workers=3, data_dir=str(tmp_path / "tfds"))
    with pytest.raises(Stop):
        prepare_data(cfg, str(tmp_path / "run"), lambda _: None, open_source=open_source)
    assert seen == [("train", 3), ("test", 3)]


def _killed(path, start, stop, shard_path):
    """A worker that dies as a kill -9 would leave it (run in the worker process)."""
    import signal

    Path(shard_path).write_bytes(b"partial")
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_worker_leaves_no_dataset(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(ts, "write_range", _killed)
    with pytest.raises(DataWorkerError, match="worker process died .*terminated abruptly"):
        _parallel(corpus, tmp_path / "tfds", monkeypatch)
    _no_dataset(tmp_path / "tfds")


def test_what_a_killed_preparation_left_is_removed_by_the_next(corpus, tmp_path, monkeypatch):
    """A preparation killed by a signal cleans nothing up itself: its folder (named by host
    and pid) is removed by the next preparation on the host once that pid is gone."""
    import shutil
    import socket
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    final = Path(_parallel(corpus, tmp_path / "tfds", monkeypatch).builder.data_dir)
    shutil.rmtree(final)  # so that the next call prepares again
    host = socket.gethostname().replace("_", "-")
    stale = final.parent / f"incomplete.elmo_{host}_{dead}_abc_{final.name}"
    (stale / "part-00000").parent.mkdir(parents=True)
    (stale / "part-00000").write_bytes(b"x" * 100)
    alive = final.parent / f"incomplete.elmo_{host}_{os.getpid()}_abc_{final.name}"  # a running one's: kept
    alive.mkdir()
    assert _parallel(corpus, tmp_path / "tfds", monkeypatch).prepared_now
    assert not stale.exists() and alive.exists()


def test_prepared_text_is_keyed_by_content_not_by_size_and_date(tmp_path):
    """An edit that keeps the file's size and modification time is prepared anew (a resume
    or a new run sharing data_dir would otherwise read the old text); the same bytes under
    another name reuse the prepared dataset."""
    text = tmp_path / "t.txt"
    text.write_bytes(b"the cat sat\nthe dog ran\n")
    first = ts.LocalTextSource(str(text), tmp_path / "tfds")
    stat = text.stat()
    text.write_bytes(b"a cow sat!\nthe fox ate!\n")  # same size
    os.utime(text, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same date
    assert text.stat().st_size == stat.st_size and text.stat().st_mtime_ns == stat.st_mtime_ns
    edited = ts.LocalTextSource(str(text), tmp_path / "tfds")
    assert edited.prepared_now
    assert list(edited) == [["a", "cow", "sat!"], ["the", "fox", "ate!"]]
    assert edited.content_id() != first.content_id()
    copy = tmp_path / "elsewhere.txt"
    copy.write_bytes(text.read_bytes())
    again = ts.LocalTextSource(str(copy), tmp_path / "tfds")
    assert not again.prepared_now and again.files == [str(copy)]
    assert list(again) == list(edited) and again.content_id() == edited.content_id()


_KILLED_TFDS_PREPARATION = """
import os, signal, sys
from elmo_jax.data import text_source as ts
generate = ts.ElmoLocalText._generate_examples
def dying(self):
    for key, example in generate(self):
        if key == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # as kill -9 of the trainer would, mid-way
        yield key, example
ts.ElmoLocalText._generate_examples = dying
ts.LocalTextSource(sys.argv[1], sys.argv[2], workers=0)
"""


def test_what_a_killed_one_process_preparation_left_is_removed_by_the_next(tmp_path):
    """kill -9 during TFDS's own preparation (data_workers=0) leaves its incomplete.*
    folder; the next preparation of that text removes it (under the preparation lock no
    live process prepares there) and prepares the whole text."""
    import subprocess
    import sys

    text = tmp_path / "t.txt"
    text.write_text("".join(f"w{i} x y\n" for i in range(20)), encoding="utf-8")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_TFDS_PREPARATION, str(text), str(tmp_path / "tfds")],
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    leftovers = list((tmp_path / "tfds").rglob("incomplete.*"))
    assert leftovers, "the killed preparation left no incomplete folder: the test does not test anything"
    src = ts.LocalTextSource(str(text), tmp_path / "tfds", workers=0)
    assert src.prepared_now and len(src) == 20 and src[19] == ["w19", "x", "y"]
    assert list((tmp_path / "tfds").rglob("incomplete.*")) == []
    assert list((tmp_path / "tfds").rglob("*.lock")) == []  # the lock lives only while held
