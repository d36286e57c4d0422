"""Random-access sentence sources for pretraining: local text, TFDS ``lm1b``, the extracted
1B Word Benchmark.  TensorFlow is never imported.

(Over 500 lines: the sources share one TFDS-reading base, and local text's one-time
preparation -- parallel, resumable, disk-full aware -- is most of the module; that preparation
is the part that could leave.)

Every source implements :class:`SentenceSource`: ``len(src)`` sentences, ``src[i]`` is
sentence ``i`` as a token list (no ``<S>``/``</S>``), ``src.get_batch(indices)`` reads several
at once, ``src.num_tokens()`` counts the words of all sentences (markers excluded).

Sources
-------
* **Local text** (:class:`LocalTextSource`): files or globs, one tokenized sentence per
  line (UTF-8, tokens split on whitespace, blank lines skipped).  They are prepared *once*
  into ArrayRecord through a TFDS builder (:class:`ElmoLocalText`) under ``data_dir`` and
  read back with ``as_data_source``.  The builder config name is a digest of the files'
  bytes (read at each call), so a second call with the same text reuses the prepared
  data, wherever the files are, and an edited file is prepared anew even if its size
  and modification time stayed.  One process prepares a dataset at a time (a lock beside
  it); what a killed preparation left is removed by the next.  With ``workers >= 1`` byte ranges of
  the files are prepared in parallel processes that write the ArrayRecord shards and TFDS's
  metadata directly (:mod:`elmo_jax.data.text_shards`; the same dataset, read the same way).  In a multi-process job only
  ``process_index == 0`` prepares; the others wait for its completion marker.
* **TFDS lm1b** (:class:`Lm1bSource`): ``tfds.data_source('lm1b', split=..., data_dir=...)``
  over the already prepared ArrayRecord files.  Getting them: the ``lm1b`` builder downloads
  1.8 GB and its preparation needs TensorFlow (it calls ``tf.io.gfile``), so run, on a
  machine that has TensorFlow and tensorflow-datasets::

      tfds build lm1b --file_format=array_record --data_dir=/data/tfds

  and copy ``/data/tfds/lm1b`` to the training machine's ``data_dir``.  Without
  TensorFlow anywhere, use the extracted benchmark instead (next item).
* **Extracted 1B Word Benchmark** (``lm1b-extracted:ROOT``): download
  ``https://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz``
  and extract it; ``ROOT`` is the ``1-billion-word-language-modeling-benchmark-r13output``
  folder (or its parent).  :func:`lm1b_extracted_files` finds the split's files, which are
  then read as local text (prepared once into ArrayRecord like any local text).

Use :func:`make_source` to pick one from a spec string.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob as globlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from typing import Protocol, cast, runtime_checkable

import tensorflow_datasets as tfds

from elmo_jax.errors import ElmoError, is_disk_full
from elmo_jax.atomic import held_lock, owned_temp_dir, write_json
from elmo_jax.chars import tokenize
from elmo_jax.data.example_proto import example_text
from elmo_jax.data.text_shards import byte_ranges, write_range
from elmo_jax.textio import decode_line, refuse_nul

__all__ = [
    "SentenceSource",
    "InMemorySource",
    "LocalTextSource",
    "Lm1bSource",
    "ElmoLocalText",
    "expand_files",
    "lm1b_extracted_files",
    "prepare_local_text",
    "make_source",
]

_READY_MARKER = "elmo_jax_ready.json"
_PREPARE_LOCK = ".elmo_jax_prepare.lock"  # beside the dataset's version folder
_OWNED_PREFIX = "incomplete.elmo_"  # the parallel preparation's folders (owner in the name)


@runtime_checkable
class SentenceSource(Protocol):
    """What the batcher reads: random access to tokenized sentences (and one pass over
    them in order, for building a vocabulary)."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> list[str]: ...

    def get_batch(self, indices: Sequence[int]) -> list[list[str]]: ...

    def num_tokens(self) -> int: ...

    def __iter__(self) -> Iterator[list[str]]: ...


class ContentDigest:
    """SHA-256 of a corpus as the sources give it: each sentence's tokens joined by spaces,
    one per line.  Tells two corpora apart whatever their paths, sizes or dates."""

    def __init__(self):
        self._h = hashlib.sha256(b"elmo_jax sentences v1\0")

    def add(self, tokens: Sequence[str]) -> None:
        self._h.update((" ".join(tokens) + "\n").encode("utf-8", "surrogatepass"))

    def add_text(self, data: bytes) -> None:
        """Sentences already in the hashed form: tokens joined by spaces, each line ending
        in a newline (what :func:`elmo_jax.data.text_shards.write_range` returns)."""
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    @classmethod
    def of(cls, sentences) -> str:
        digest = cls()
        for tokens in sentences:
            digest.add(tokens)
        return digest.hexdigest()


class InMemorySource:
    """Sentences held in memory (token lists or whitespace-separated strings)."""

    def __init__(self, sentences):
        self._sentences = [tokenize(s) for s in sentences]
        for i, tokens in enumerate(self._sentences):
            refuse_nul(" ".join(tokens), f"sentence {i}")
        self._num_tokens = sum(len(s) for s in self._sentences)

    def __len__(self) -> int:
        return len(self._sentences)

    def __getitem__(self, i: int) -> list[str]:
        return list(self._sentences[i])

    def get_batch(self, indices: Sequence[int]) -> list[list[str]]:
        return [list(self._sentences[int(i)]) for i in indices]

    def num_tokens(self) -> int:
        return self._num_tokens

    def content_id(self) -> str:
        """Identifies the sentences (see :class:`ContentDigest`)."""
        return "sha256:" + ContentDigest.of(self._sentences)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


class _TfdsTextSource:
    """A TFDS data source whose examples hold one sentence in the feature ``text``.

    Records are read raw from the underlying ArrayRecord source and the sentence taken from
    the protobuf bytes directly (:func:`example_text`), about 10x cheaper than TFDS's
    general decoding, which remains the fallback for any other layout.
    """

    def __init__(self, data_source, name: str, num_tokens: int | None = None):
        self._ds = data_source
        self._name = name
        self._num_tokens = num_tokens
        self._bulk_ok = True

    @staticmethod
    def _split(example) -> list[str]:
        text = example["text"]
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return tokenize(text)

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, i: int) -> list[str]:
        n = len(self._ds)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"sentence index {i} out of range for {self._name} ({n} sentences)")
        return self._split(self._ds[i % n])

    def get_batch(self, indices: Sequence[int]) -> list[list[str]]:
        keys = [int(i) for i in indices]
        if not keys:
            return []
        raw_source = getattr(self._ds, "data_source", None)
        if self._bulk_ok and raw_source is not None and hasattr(raw_source, "__getitems__"):
            try:
                records = raw_source.__getitems__(keys)
            except TypeError:
                records = None
            if records is not None and len(records) == len(keys):
                texts = [example_text(r) if isinstance(r, bytes) else None for r in records]
                if None not in texts:
                    return [t.decode("utf-8").split() for t in cast("list[bytes]", texts)]
        if self._bulk_ok:
            try:
                return [self._split(ex) for ex in self._ds.__getitems__(keys)]
            except TypeError:
                # tfds.testing.mock_data patches __getitems__ with a broken signature.
                self._bulk_ok = False
        return [self._split(self._ds[k]) for k in keys]

    def __iter__(self):
        chunk = 4096
        for start in range(0, len(self), chunk):
            yield from self.get_batch(range(start, min(start + chunk, len(self))))

    def _count_tokens(self) -> int:
        return sum(len(s) for s in self)

    def num_tokens(self) -> int:
        if self._num_tokens is None:
            self._num_tokens = self._count_tokens()
        return self._num_tokens

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name}, {len(self)} sentences)"


# ---------------------------------------------------------------------------- local text
@dataclasses.dataclass
class LocalTextConfig(tfds.core.BuilderConfig):
    """Config of :class:`ElmoLocalText`: the files, in reading order."""

    files: tuple[str, ...] = ()


class _LocalTextInfo(tfds.core.DatasetInfo):
    """The info of local text, which TFDS's bucket of pre-computed infos cannot hold: its
    look-up there is skipped (TFDS makes a temporary folder for it that it never removes)."""

    def initialize_from_bucket(self) -> None:
        return None


class ElmoLocalText(tfds.core.GeneratorBasedBuilder):
    """Local tokenized text (one sentence per line) -> ArrayRecord, feature ``text``.

    Examples keep file order (shuffling disabled): the batcher shuffles, evaluation wants
    the original order.  Build it through :func:`prepare_local_text`.
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First version."}
    # No checksums file or code folder to look up: for a builder inside a package TFDS's
    # lookup would go through importlib_resources, which is not needed to read plain text.
    code_path = None

    # TFDS prints "Downloading and preparing dataset Unknown size (download: Unknown size, ...)"
    # and "... downloaded and prepared ..." for every builder: wrong for local text (nothing is
    # downloaded, offline), so one line of our own replaces the two.
    def _log_download_bytes(self) -> None:
        files = list(self.builder_config.files)
        shown = files[0] if len(files) == 1 else f"{len(files)} files ({files[0]}, ...)"
        print(f"preparing {shown} for reading (once; ArrayRecord in {self.data_dir})", flush=True)

    def _log_download_done(self) -> None:
        pass

    def _info(self) -> tfds.core.DatasetInfo:
        return _LocalTextInfo(
            builder=self,
            description="Tokenized text, one sentence per line, read from local files.",
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        n_sentences = 0
        n_tokens = 0
        digest = ContentDigest()
        for path in self.builder_config.files:
            with open(path, "rb") as f:
                for lineno, raw in enumerate(f, start=1):
                    line = decode_line(raw, path, lineno)
                    tokens = tokenize(line)
                    if not tokens:
                        continue
                    yield n_sentences, {"text": " ".join(tokens)}
                    digest.add(tokens)
                    n_sentences += 1
                    n_tokens += len(tokens)
        if n_sentences == 0:
            raise ValueError("empty corpus: no non-blank line in " + ", ".join(self.builder_config.files))
        self.elmo_stats = {"num_sentences": n_sentences, "num_tokens": n_tokens, "content_sha256": digest.hexdigest()}


def expand_files(patterns: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Files named by paths and/or globs (each glob sorted), absolute, duplicates dropped.

    A comma-separated string is split, unless it names an existing file; an existing file
    whose name looks like a glob is taken as it is.  A missing file, a glob that matches
    nothing, a directory, or no file at all gives a ``FileNotFoundError`` saying which.
    """
    if isinstance(patterns, (str, os.PathLike)):
        whole = os.path.expanduser(os.fspath(patterns).strip())
        # An existing file is one path even if its name holds a comma.
        patterns = [whole] if os.path.isfile(whole) else [p for p in os.fspath(patterns).split(",") if p.strip()]
    files: list[str] = []
    for pat in patterns:
        pat = os.path.expanduser(os.fspath(pat).strip())
        if globlib.has_magic(pat) and not os.path.isfile(pat):  # 'corpus[2020].txt' is a file
            matches = sorted(m for m in globlib.glob(pat) if os.path.isfile(m))
            if not matches:
                raise FileNotFoundError(f"no file matches the glob {pat!r}")
        else:
            if os.path.isdir(pat):
                raise FileNotFoundError(f"{pat!r} is a directory; give files or a glob such as '{pat}/*.txt'")
            if not os.path.isfile(pat):
                raise FileNotFoundError(f"text file not found: {pat!r}")
            matches = [pat]
        files.extend(os.path.abspath(m) for m in matches)
    if not files:
        raise FileNotFoundError(f"no text file given ({patterns!r})")
    return list(dict.fromkeys(files))


def _corpus_key(files: Sequence[str]) -> str:
    """The prepared dataset's name: a digest of the files' bytes, in reading order.

    Keyed by content, not by path, size and date: an edit that keeps a file's size and
    modification time still gets its own dataset, and the same text under another name or
    in another folder reuses the one prepared.  Each start reads every file once for it
    (SHA-256 at about 1 GB/s, see benchmarks/README.md)."""
    h = hashlib.sha256(b"elmo_jax local text v2\0")
    for path in files:
        with open(path, "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())  # fixed length: no separator needed
    return "corpus_" + h.hexdigest()[:20]


def _default_data_dir(data_dir: str | os.PathLike | None) -> str:
    if data_dir is None:
        return os.path.expanduser(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))
    return os.fspath(data_dir)


def prepare_local_text(
    files: str | Sequence[str],
    data_dir: str | os.PathLike | None = None,
    *,
    process_index: int = 0,
    wait_timeout_s: float = 6 * 3600.0,
    poll_s: float = 1.0,
    workers: int = 0,
) -> tuple[ElmoLocalText, dict]:
    """Prepare local text files into ArrayRecord once; return ``(builder, info)``.

    ``info`` holds ``files``, ``num_sentences``, ``num_tokens``, ``content_sha256`` and
    ``prepared_now`` (False when earlier prepared data was reused); after a preparation in
    workers also ``worker_cpu_s``, their CPU time.  Process 0 prepares and
    then writes a completion marker; other processes wait (up to ``wait_timeout_s``) for
    that marker.

    ``workers=0`` prepares in this process through the TFDS builder; ``N >= 1`` reads byte
    ranges of the files in ``N`` processes that write the ArrayRecord shards directly
    (:mod:`elmo_jax.data.text_shards`): the same sentences in the same order, the same
    counts and content digest, read back the same way.  Either way the dataset's folder
    appears only when complete.
    """
    files = expand_files(files)
    data_dir = _default_data_dir(data_dir)
    config = LocalTextConfig(
        name=_corpus_key(files),
        description="files: " + ", ".join(files),
        files=tuple(files),
    )
    builder = ElmoLocalText(config=config, data_dir=data_dir, file_format="array_record")
    marker = os.path.join(builder.data_dir, _READY_MARKER)

    def read_marker():
        with open(marker, encoding="utf-8") as f:
            return json.load(f)

    if os.path.isfile(marker):
        info = read_marker()
        # the same bytes, perhaps prepared from other paths: these are the files read
        return builder, {**info, "files": files, "prepared_now": False}
    if process_index != 0:
        deadline = time.monotonic() + wait_timeout_s
        while not os.path.isfile(marker):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"process {process_index}: process 0 did not finish preparing {files} "
                    f"within {wait_timeout_s:.0f} s (no marker {marker})"
                )
            time.sleep(poll_s)
        # Re-create the builder: its info is now read from the prepared directory.
        builder = ElmoLocalText(config=config, data_dir=data_dir, file_format="array_record")
        return builder, {**read_marker(), "files": files, "prepared_now": False}

    # One preparation of a dataset at a time (runs sharing data_dir): under the lock, a
    # folder TFDS was preparing in (incomplete.*) is a killed preparation's leftover.
    parent = os.path.dirname(builder.data_dir)
    new_folders = _folders_not_yet_made(data_dir, parent)
    try:
        os.makedirs(parent, exist_ok=True)
        with held_lock(os.path.join(parent, _PREPARE_LOCK)):
            if os.path.isfile(marker):  # prepared by another run while this one waited
                builder = ElmoLocalText(config=config, data_dir=data_dir, file_format="array_record")
                return builder, {**read_marker(), "files": files, "prepared_now": False}
            _remove_tfds_leftovers(parent)
            return _prepare(builder, config, data_dir, files, workers, marker)
    except BaseException:
        _remove_empty_folders(new_folders)  # a refused or failed preparation leaves no empty shell
        raise


def _folders_not_yet_made(data_dir: str, parent: str) -> list[str]:
    """The folders a preparation in ``data_dir`` may create (the dataset's ``parent``, TFDS's
    ``downloads/extracted``) that do not exist yet, each before the folder holding it."""
    folders = [
        parent,
        os.path.dirname(parent),
        os.path.join(data_dir, "downloads", "extracted"),
        os.path.join(data_dir, "downloads"),
        data_dir,
    ]
    return [p for p in folders if not os.path.exists(p)]


def _remove_empty_folders(folders: Sequence[str]) -> None:
    """Remove those of ``folders`` that are empty (in order: a folder emptied by an earlier
    removal goes too); one that another run has put something in stays."""
    for path in folders:
        try:
            os.rmdir(path)
        except OSError:
            pass


def _prepare(
    builder: ElmoLocalText, config: LocalTextConfig, data_dir: str, files: list[str], workers: int, marker: str
) -> tuple[ElmoLocalText, dict]:
    """Prepare ``files`` (see :func:`prepare_local_text`; the caller holds the lock)."""
    if workers > 0 and not os.path.isdir(builder.data_dir):
        with _disk_full_named(files, data_dir):
            worker_cpu_s = _prepare_in_parallel(builder, files, workers)
        builder = ElmoLocalText(config=config, data_dir=data_dir, file_format="array_record")
        with open(marker, encoding="utf-8") as f:
            info = json.load(f)
        return builder, {**info, "prepared_now": True, "worker_cpu_s": worker_cpu_s}
    with _disk_full_named(files, data_dir):
        builder.download_and_prepare()
    stats = getattr(builder, "elmo_stats", None)
    if stats is None:  # prepared earlier by a run that died before writing its marker
        src = _TfdsTextSource(builder.as_data_source(split="train"), config.name)
        stats = {"num_sentences": len(src), "num_tokens": src.num_tokens(), "content_sha256": ContentDigest.of(src)}
    info = {"files": files, **stats}
    _write_marker(marker, info)
    return builder, {**info, "prepared_now": True}


def _remove_tfds_leftovers(parent: str) -> None:
    """Remove the folders TFDS's own preparation (``workers=0``) left in ``parent`` when it
    was killed: ``incomplete.XXXXXX_<version>``.  Only under the preparation lock, when no
    live process prepares there; the parallel path's folders name their owner and are
    removed by :func:`~elmo_jax.atomic.owned_temp_dir`."""
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith("incomplete.") and not name.startswith(_OWNED_PREFIX) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


# What ArrayRecord adds to each sentence, as measured (tests/test_preparation_space.py): a
# chunk of its own (group_size:1) with its header and index entry, and the tf.train.Example
# around the text: 75-87 bytes per line of 1-40 tokens, on top of at most the text's bytes
# (longer records are compressed a little).  Rounded up, so that the estimate is a bound.
_BYTES_PER_LINE = 96
_METADATA_BYTES = 64 << 10  # dataset_info.json, features.json, the marker


def prepared_bytes_estimate(files: Sequence[str]) -> int:
    """About the most bytes the prepared copy of ``files`` takes: their bytes, plus
    :data:`_BYTES_PER_LINE` per line, plus the metadata (one pass to count the lines)."""
    total = lines = 0
    for path in files:
        last = b"\n"
        try:
            with open(path, "rb") as f:
                while block := f.read(1 << 22):
                    total += len(block)
                    lines += block.count(b"\n")
                    last = block[-1:]
        except OSError:
            continue
        lines += last != b"\n"  # a last line without its newline
    return total + lines * _BYTES_PER_LINE + _METADATA_BYTES


class DataDiskFullError(ElmoError, OSError):
    """No space left to prepare the text; nothing half-written was kept."""


@contextlib.contextmanager
def _disk_full_named(files: Sequence[str], data_dir: str) -> Iterator[None]:
    """A full disk while preparing (however the writer or a worker words it) -> one line
    with the space needed (:func:`prepared_bytes_estimate`) and what is free."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e):
            raise
        needed = prepared_bytes_estimate(files)
        try:
            free = f"{shutil.disk_usage(data_dir).free / 2**20:.1f} MiB are free"
        except OSError:
            free = "the free space could not be read"
        raise DataDiskFullError(
            f"disk full: the text ({', '.join(files)}) could not be prepared in {data_dir} (its prepared "
            f"copy needs about {needed / 2**20:.1f} MiB, {free}); nothing half-written was kept. Free "
            f"some space or set data_dir (--config.data_dir) to a disk with room, and run the same "
            f"command again"
        ) from None


def _write_marker(marker: str, info: dict) -> None:
    write_json(marker, info, indent=1)  # atomic: waiters never see a half-written marker


def _prepare_in_parallel(builder: ElmoLocalText, files: list[str], workers: int) -> float:
    """Write the prepared dataset of ``files`` with ``workers`` processes: shards, TFDS's
    ``dataset_info.json`` / ``features.json`` and the completion marker go to a temporary
    folder beside ``builder.data_dir``, which is renamed to it at the end (so an interrupted
    or failed preparation leaves no dataset folder).  Returns the workers' CPU seconds."""
    from elmo_jax.data.workers import worker_pool

    final = builder.data_dir
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    # Named by host and pid: what a killed preparation left is removed by the next one.
    tmp = owned_temp_dir(parent, _OWNED_PREFIX, suffix="_" + os.path.basename(final))
    try:
        ranges = byte_ranges([os.path.getsize(p) for p in files], workers)
        parts = [os.path.join(tmp, f"part-{k:05d}") for k in range(len(ranges))]
        digest = ContentDigest()
        results = []
        with worker_pool(min(workers, len(ranges)), "text preparation") as pool:  # a dead worker: one line
            pending = []
            window = workers + 2  # ranges in flight: bounds the content held here
            for k, (i, a, b) in enumerate(ranges):
                pending.append(pool.submit(write_range, files[i], a, b, parts[k]))
                while len(pending) > window or (pending and k == len(ranges) - 1):
                    result = pending.pop(0).result()
                    digest.add_text(result.pop("content"))  # in range order: the file order
                    results.append(result)
        n_sentences = sum(r["num_sentences"] for r in results)
        if n_sentences == 0:
            raise ValueError("empty corpus: no non-blank line in " + ", ".join(files))
        kept = [(part, r) for part, r in zip(parts, results) if r["num_sentences"]]
        for part, r in zip(parts, results):
            if not r["num_sentences"]:  # a range of blank lines: no shard
                os.remove(part)
        template = tfds.core.naming.ShardedFileTemplate(
            data_dir=tmp, dataset_name=builder.name, split="train", filetype_suffix="array_record"
        )
        for index, (part, _) in enumerate(kept):
            os.replace(part, os.fspath(template.sharded_filepath(shard_index=index, num_shards=len(kept))))
        builder.info.set_splits(
            tfds.core.SplitDict(
                [
                    tfds.core.SplitInfo(
                        name="train",
                        shard_lengths=[r["num_sentences"] for _, r in kept],
                        num_bytes=sum(r["num_bytes"] for r in results),
                    )
                ]
            )
        )
        builder.info.write_to_directory(tmp)
        stats = {
            "num_sentences": n_sentences,
            "num_tokens": sum(r["num_tokens"] for r in results),
            "content_sha256": digest.hexdigest(),
        }
        _write_marker(os.path.join(tmp, _READY_MARKER), {"files": files, **stats})
        try:
            os.rename(tmp, final)  # the dataset appears whole, marker included
        except OSError:
            if not os.path.exists(os.path.join(final, _READY_MARKER)):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another run prepared the same text meanwhile
        return sum(r["cpu_s"] for r in results)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class LocalTextSource(_TfdsTextSource):
    """Local text files/globs, prepared once into ArrayRecord under ``data_dir``."""

    def __init__(
        self,
        files: str | Sequence[str],
        data_dir: str | os.PathLike | None = None,
        *,
        process_index: int = 0,
        wait_timeout_s: float = 6 * 3600.0,
        workers: int = 0,
    ):
        builder, info = prepare_local_text(
            files, data_dir, process_index=process_index, wait_timeout_s=wait_timeout_s, workers=workers
        )
        self.builder = builder
        self.info = info
        self.files = list(info["files"])
        self.prepared_now = info["prepared_now"]
        super().__init__(
            builder.as_data_source(split="train"),
            name=", ".join(self.files) if len(self.files) <= 3 else f"{len(self.files)} files",
            num_tokens=info["num_tokens"],
        )

    def content_id(self) -> str:
        """Identifies the sentences (see :class:`ContentDigest`; computed while preparing)."""
        if "content_sha256" not in self.info:  # prepared by an older version: one pass, once
            self.info["content_sha256"] = ContentDigest.of(self)
            marker = os.path.join(self.builder.data_dir, _READY_MARKER)
            try:  # best effort: prepared data may live in a read-only folder
                _write_marker(marker, {k: v for k, v in self.info.items() if k not in ("prepared_now", "worker_cpu_s")})
            except OSError:
                pass
        return "sha256:" + self.info["content_sha256"]


# ---------------------------------------------------------------------------- lm1b
class Lm1bSource(_TfdsTextSource):
    """The TFDS ``lm1b`` dataset (splits ``train``, ``test``), read without TensorFlow.

    Needs the prepared ArrayRecord files under ``data_dir`` (see the module docstring).
    The token count takes one pass over the split; it is cached next to the data
    (``elmo_jax_num_tokens-<split>.json``) when that folder is writable.
    """

    def __init__(self, split: str = "train", data_dir: str | os.PathLike | None = None):
        try:
            # download=False: the lm1b builder would otherwise fetch 1.8 GB and need
            # TensorFlow to prepare it.
            ds = tfds.data_source("lm1b", split=split, data_dir=data_dir, download=False)
        except Exception as e:  # noqa: BLE001 - re-raised with a hint
            root = _default_data_dir(data_dir)
            # Without the folder TFDS's own text is misleading ("already prepared ... in the
            # TFRECORD format" for a folder that does not exist): say what is missing.
            reason = (
                f"no prepared lm1b under {root} (no folder {os.path.join(root, 'lm1b')})"
                if not os.path.isdir(os.path.join(root, "lm1b"))
                else str(e)
            )
            raise ElmoError(
                f"could not open TFDS lm1b split {split!r}: {reason}\n"
                "Prepare it with `tfds build lm1b --file_format=array_record` on a machine with "
                "TensorFlow, or use the extracted benchmark: 'lm1b-extracted:/path/to/"
                "1-billion-word-language-modeling-benchmark-r13output'"
            ) from e
        self.split = split
        self._version = str(getattr(getattr(ds, "dataset_info", None), "version", ""))
        super().__init__(ds, name=f"lm1b/{split}")
        self._cache_path = None
        try:
            folder = ds.dataset_info.data_dir
            if folder and os.path.isdir(folder):
                self._cache_path = os.path.join(folder, f"elmo_jax_num_tokens-{split}.json")
        except Exception:  # noqa: BLE001 - the cache is optional
            self._cache_path = None

    def content_id(self) -> str:
        """The TFDS dataset, version, split and size (its data is fixed; hashing it would
        take one pass over 30M sentences)."""
        return f"tfds:lm1b:{self._version}/{self.split}:{len(self)}"

    def num_tokens(self) -> int:
        if self._num_tokens is not None:
            return self._num_tokens
        if self._cache_path and os.path.isfile(self._cache_path):
            with open(self._cache_path, encoding="utf-8") as f:
                cached = json.load(f)
            if cached.get("num_sentences") == len(self):
                self._num_tokens = int(cached["num_tokens"])
                return self._num_tokens
        self._num_tokens = self._count_tokens()
        if self._cache_path:
            try:
                write_json(self._cache_path, {"num_sentences": len(self), "num_tokens": self._num_tokens})
            except OSError:
                pass
        return self._num_tokens


# ---------------------------------------------------------------------------- extracted 1B
_LM1B_TOP = "1-billion-word-language-modeling-benchmark-r13output"
_LM1B_TRAIN = os.path.join("training-monolingual.tokenized.shuffled", "news.en-*-of-00100")
_LM1B_HELDOUT = os.path.join("heldout-monolingual.tokenized.shuffled", "news.en.heldout-*")
_LM1B_TEST0 = os.path.join("heldout-monolingual.tokenized.shuffled", "news.en.heldout-00000-of-00050")


def lm1b_extracted_files(root: str | os.PathLike, split: str = "train") -> str:
    """The glob of the extracted 1B Word Benchmark's files for ``split``.

    ``root`` is the ``1-billion-word-language-modeling-benchmark-r13output`` folder or its
    parent.  Splits: ``train`` (the 99 training shards), ``test``/``heldout`` (all 50
    held-out shards, like TFDS ``lm1b`` test), ``heldout0`` (``news.en.heldout-00000-of-00050``
    only, the benchmark's usual test set).
    """
    root = os.path.expanduser(os.fspath(root))
    rel = {
        "train": _LM1B_TRAIN,
        "test": _LM1B_HELDOUT,
        "heldout": _LM1B_HELDOUT,
        "validation": _LM1B_HELDOUT,
        "heldout0": _LM1B_TEST0,
    }.get(split)
    if rel is None:
        raise ValueError(f"unknown lm1b split {split!r}: use train, test (= heldout) or heldout0")
    for base in (root, os.path.join(root, _LM1B_TOP)):
        pattern = os.path.join(base, rel)
        if globlib.glob(pattern):
            return pattern
    raise FileNotFoundError(
        f"no 1B Word Benchmark {split} files under {root!r}: expected {os.path.join(root, rel)!r} "
        f"or {os.path.join(root, _LM1B_TOP, rel)!r} (extract "
        f"{_LM1B_TOP}.tar.gz and pass that folder)"
    )


# ---------------------------------------------------------------------------- factory
def make_source(
    spec: str,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    *,
    process_index: int = 0,
    wait_timeout_s: float = 6 * 3600.0,
    workers: int = 0,
) -> SentenceSource:
    """A sentence source from a spec string.

    * ``"lm1b"`` -> TFDS ``lm1b``, split ``split`` (``train`` / ``test``);
    * ``"lm1b-extracted:ROOT"`` -> the extracted benchmark's ``split`` files, as local text;
    * ``"text:PATHS"`` or plain ``PATHS`` -> local text; ``PATHS`` is a path, a glob, or a
      comma-separated list of them.  ``split`` is not used: the files are the split.

    Local text is prepared into ``data_dir`` (TFDS default when None) by process 0 only,
    in ``workers`` processes (0: in this process; see :func:`prepare_local_text`).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty data spec {spec!r}")
    spec = spec.strip()
    if spec in ("lm1b", "tfds:lm1b"):  # the second: an older spelling, kept for runs that used it
        return Lm1bSource(split=split, data_dir=data_dir)
    if spec.startswith(("lm1b:", "tfds:")):
        raise ValueError(
            f"unknown data spec {spec!r}: TFDS lm1b is spelled 'lm1b' (training reads its "
            f"train split, evaluation its test split); see make_source for the others"
        )
    if spec.startswith("lm1b-extracted:"):
        files = lm1b_extracted_files(spec[len("lm1b-extracted:") :], split)
        return LocalTextSource(
            files, data_dir, process_index=process_index, wait_timeout_s=wait_timeout_s, workers=workers
        )
    if spec.startswith("text:"):
        spec = spec[len("text:") :]
    return LocalTextSource(spec, data_dir, process_index=process_index, wait_timeout_s=wait_timeout_s, workers=workers)
