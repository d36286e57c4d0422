"""elmo_jax.hub: models by name or URL, fetched from an HTTP server this file starts on
127.0.0.1 (never the internet), with resume, checks, the sha256 record, offline mode,
archives and concurrent downloads."""

import hashlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import urllib.parse
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import REPO, require_fixtures, wait_for
from elmo_jax import Elmo, hub
from elmo_jax.errors import ElmoError
from elmo_jax.formats.downloads import DownloadFormats
from elmo_jax.resolve import resolve_model
from elmo_jax.cli import main
from elmo_jax.config import ElmoConfig
from elmo_jax.formats.hdf5 import datasets_to_params, expected_shapes, save_weights

SMALL_DIR = hub.RELEASED_MODELS["small"]


# -- a local HTTP server with Range support and scripted failures -------------------------
class _Routes:
    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.drop_once: dict[str, int] = {}  # path -> bytes sent before the first full GET is cut
        self.drop_always: dict[str, int] = {}  # path -> every GET is cut there, and Range is ignored
        self.hold: dict[str, threading.Event] = {}  # path -> the response waits for this event
        self.after_drop: dict[str, bytes] = {}  # path -> its new content once a GET was cut
        self.log: list[tuple[str, str | None]] = []  # (path, Range header) of every GET
        self.announce_extra: dict[str, int] = {}  # path -> Content-Length says this many bytes more
        self.pause_after: dict[str, tuple[int, threading.Event]] = {}  # path -> send n bytes, then wait
        self.lock = threading.Lock()

    def gets(self, path: str) -> list[str | None]:
        with self.lock:
            return [rng for p, rng in self.log if p == path]


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        routes: _Routes = self.server.routes
        path = urllib.parse.urlsplit(self.path).path
        rng = self.headers.get("Range")
        with routes.lock:
            routes.log.append((path, rng))
        body = routes.files.get(path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        if path in routes.hold:
            routes.hold[path].wait(timeout=60)
        etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
        start = 0
        if rng and path not in routes.drop_always and self.headers.get("If-Range", etag) == etag:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
        if start and start >= len(body):
            self.send_error(416, "Range Not Satisfiable")
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start + routes.announce_extra.get(path, 0)))
        self.send_header("ETag", etag)
        self.end_headers()
        cut = routes.drop_always.get(path)
        if cut is None and start == 0:
            with routes.lock:
                cut = routes.drop_once.pop(path, None)
        payload = body[start:]
        if path in routes.pause_after and start == 0:
            n, event = routes.pause_after[path]
            self.wfile.write(payload[:n])
            self.wfile.flush()
            event.wait(timeout=60)
            payload = payload[n:]
        self.wfile.write(payload if cut is None else payload[:cut])
        if cut is not None and path in routes.after_drop:  # the file is replaced on the server
            routes.files[path] = routes.after_drop.pop(path)
        self.close_connection = True  # HTTP/1.0: the socket closes when this returns


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.routes = _Routes()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_port}"
    yield srv
    srv.shutdown()
    srv.server_close()


def _serve(server, folder: str, files: dict[str, bytes]) -> str:
    """Put ``files`` under ``/folder/`` on the server; returns the folder's URL."""
    for name, data in files.items():
        server.routes.files[f"/{folder}/{name}"] = data
    return f"{server.url}/{folder}/"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """A fresh cache per test; no offline switch or models URL from the caller's shell."""
    monkeypatch.setenv(hub.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.delenv(hub.OFFLINE_ENV, raising=False)
    monkeypatch.delenv(hub.MODELS_URL_ENV, raising=False)
    return tmp_path / "home"


def _entries(home: Path) -> list[str]:
    """What the cache holds besides its lock files."""
    models = home / "models"
    return sorted(p.name for p in models.iterdir() if p.name != ".locks") if models.exists() else []


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- models to serve ----------------------------------------------------------------------
TINY_OPTIONS = {
    "lstm": {
        "dim": 16,
        "projection_dim": 8,
        "n_layers": 1,
        "cell_clip": 3,
        "proj_clip": 3,
        "use_skip_connections": True,
    },
    "char_cnn": {
        "embedding": {"dim": 4},
        "filters": [[1, 4], [2, 8]],
        "n_highway": 1,
        "n_characters": 262,
        "max_characters_per_token": 50,
        "activation": "relu",
    },
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, bytes]:
    return _tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _tiny_model(folder: Path, seed: int) -> dict[str, bytes]:
    """A small random model in the released layout (no jax: numpy arrays of the right shapes)."""
    config = ElmoConfig.from_options(TINY_OPTIONS)
    rng = np.random.default_rng(seed)
    datasets = {k: rng.standard_normal(s).astype(np.float32) for k, s in expected_shapes(config).items()}
    save_weights(datasets_to_params(datasets, config), config, folder / "weights.hdf5")
    config.to_json_file(folder / "options.json")
    return {n: (folder / n).read_bytes() for n in ("options.json", "weights.hdf5")}


@pytest.fixture(scope="module")
def fixture_model() -> dict[str, bytes]:
    model = require_fixtures() / "model"
    return {
        "options.json": (model / "options.json").read_bytes(),
        "weights.hdf5": (model / "lm_weights.hdf5").read_bytes(),
    }


def _serve_released(server, name: str, model: dict[str, bytes], monkeypatch, root: str) -> dict[str, str]:
    """Serve ``model`` as the released model ``name`` under a test models URL."""
    folder = hub.RELEASED_MODELS[name]
    paths = {n: f"/{root}/{folder}/elmo_{folder}_{n}" for n in ("options.json", "weights.hdf5")}
    for n, p in paths.items():
        server.routes.files[p] = model[n]
    monkeypatch.setenv(hub.MODELS_URL_ENV, f"{server.url}/{root}")
    return paths


# -- the URL forms --------------------------------------------------------------------------
def test_names_and_url_forms_map_to_the_expected_files():
    src = hub.model_source("small")
    assert src.key == "small" and src.archive_url is None
    base = f"https://allennlp.s3.amazonaws.com/models/elmo/{SMALL_DIR}/elmo_{SMALL_DIR}_"
    assert dict(src.file_urls) == {"options.json": base + "options.json", "weights.hdf5": base + "weights.hdf5"}
    assert hub.RELEASED_MODELS["original-5.5b"] == "2x4096_512_2048cnn_2xhighway_5.5B"
    assert dict(hub.model_source("medium", "http://mirror/x/").file_urls)["weights.hdf5"] == (
        "http://mirror/x/2x2048_256_2048cnn_1xhighway/elmo_2x2048_256_2048cnn_1xhighway_weights.hdf5"
    )

    folder = hub.model_source("https://h/m/ru/")
    assert dict(folder.file_urls) == {
        "options.json": "https://h/m/ru/options.json",
        "weights.hdf5": "https://h/m/ru/weights.hdf5",
    }
    # A URL of either file is the same model (and cache entry) as its folder; queries are kept.
    assert hub.model_source("https://h/m/ru/options.json") == hub.ModelSource(
        "https://h/m/ru/options.json", folder.key, folder.file_urls
    )
    assert hub.model_source("https://h/m/ru/weights.hdf5").key == folder.key
    prefix = hub.model_source("https://h/m/elmo_x_weights.hdf5?sig=1")
    assert dict(prefix.file_urls)["options.json"] == "https://h/m/elmo_x_options.json?sig=1"
    assert prefix.key.startswith("elmo_x-") and prefix.key != hub.model_source("https://h/m/elmo_x_").key
    archive = hub.model_source("https://h/models/ru.tar.gz")
    assert archive.archive_url == "https://h/models/ru.tar.gz" and archive.key.startswith("ru-")
    assert hub.model_source("https://h/models/ru.zip").key != archive.key
    with pytest.raises(ValueError, match="neither a released model"):
        hub.model_source("smal")


def test_local_folders_are_returned_as_they_are(tmp_path, home, monkeypatch):
    assert resolve_model(tmp_path) == tmp_path
    assert resolve_model(str(tmp_path)) == tmp_path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small").mkdir()
    monkeypatch.setenv(hub.OFFLINE_ENV, "1")  # nothing is fetched: the folder wins over the name
    assert resolve_model("small") == Path("small")
    monkeypatch.delenv(hub.OFFLINE_ENV)
    with pytest.raises(FileNotFoundError, match=r"model folder not found: .*nope; .*small, medium, original"):
        resolve_model(tmp_path / "nope")
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(ElmoError, match="is a file"):
        resolve_model(tmp_path / "f.json")
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        Elmo.load(tmp_path / "smal")  # not a name: Elmo.load's own error, nothing fetched
    assert _entries(home) == []
    # Neither an empty spec (Path("") would be the current folder) nor a URL without a host.
    for spec in ("", "  "):
        with pytest.raises(ValueError, match="no model given"):
            resolve_model(spec)
    for spec in ("http://", "https:///models/x/"):
        with pytest.raises(ValueError, match="names no host"):
            resolve_model(spec)
    assert _entries(home) == []


# -- downloads ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "which,shape", [("fixture_model", (3, 5, 32)), ("tiny", (2, 5, 16))], ids=["bilm-tf-fixture", "tiny"]
)
def test_released_name_downloads_once_then_loads_and_embeds(
    server, monkeypatch, home, tmp_path, capsys, request, which, shape
):
    model = request.getfixturevalue(which)
    paths = _serve_released(server, "small", model, monkeypatch, f"named-{which}")
    elmo = Elmo.load("small")  # the test model served as "small"
    entry = home / "models" / "small"
    assert [server.routes.gets(p) for p in paths.values()] == [[None], [None]]
    assert sorted(p.name for p in entry.iterdir()) == ["download.json", "options.json", "weights.hdf5"]
    manifest = json.loads((entry / "download.json").read_text())
    assert manifest["sha256"] == {n: _sha(b) for n, b in model.items()}
    assert manifest["origin"] == "downloaded" and manifest["spec"] == "small"
    (tmp_path / "served").mkdir()
    for name, data in model.items():
        (tmp_path / "served" / name).write_bytes(data)
    for a, b in zip(jax_leaves(elmo.params), jax_leaves(Elmo.load(tmp_path / "served").params), strict=True):
        np.testing.assert_array_equal(a, b)
    vectors = elmo.embed(["the bank of the river"])[0]
    assert vectors.shape == shape

    # Later uses read the cache (checking its sha256), also from the command line.
    src = tmp_path / "in.txt"
    src.write_text("the bank of the river\n", encoding="utf-8")
    assert main(["embed", str(src), str(tmp_path / "out.hdf5"), "--all", "--model", "small", "--no-progress"]) == 0
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        np.testing.assert_allclose(f["0"][...], vectors, atol=1e-6, rtol=0)
    capsys.readouterr()
    assert main(["download", "small"]) == 0
    out = capsys.readouterr().out
    assert f"small: {entry}" in out and f"weights.hdf5  ({len(model['weights.hdf5']):,} bytes)" in out
    assert [len(server.routes.gets(p)) for p in paths.values()] == [1, 1]


def jax_leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("changed", [False, True], ids=["same-file", "file-changed-meanwhile"])
def test_dropped_connection_is_resumed_with_range(server, tiny, home, tmp_path, changed):
    folder = f"drop-{changed}"
    url = _serve(server, folder, tiny)
    weights = tiny["weights.hdf5"]
    cut = len(weights) // 3
    server.routes.drop_once[f"/{folder}/weights.hdf5"] = cut
    if changed:  # If-Range then gets the whole new file (200), which replaces the part held
        weights = _tiny_model(tmp_path, seed=1)["weights.hdf5"]  # same layout and size, other values
        assert len(weights) == len(tiny["weights.hdf5"]) and weights[:cut] != tiny["weights.hdf5"][:cut]
        server.routes.after_drop[f"/{folder}/weights.hdf5"] = weights
    entry = resolve_model(url, progress=False)
    assert server.routes.gets(f"/{folder}/weights.hdf5") == [None, f"bytes={cut}-"]
    assert (entry / "weights.hdf5").read_bytes() == weights
    assert json.loads((entry / "download.json").read_text())["sha256"]["weights.hdf5"] == _sha(weights)
    assert _entries(home) == [entry.name]
    assert Elmo.load(url).config == ElmoConfig.from_options(TINY_OPTIONS)  # the cached copy, by URL


def test_a_connection_that_keeps_dropping_gives_up_and_caches_nothing(server, tiny, home):
    _serve(server, "flaky", tiny)
    server.routes.drop_always["/flaky/weights.hdf5"] = 1000  # and Range is ignored
    source = hub.model_source(f"{server.url}/flaky/")
    with pytest.raises(
        hub.DownloadError,
        match=r"weights.hdf5: gave up after 3 attempts in a row without "
        r"progress \(connection closed after 1000 of \d+ bytes",
    ):
        hub.fetch_model(source, home / "models", formats=DownloadFormats(), progress=False, retry_delays_s=(0.0, 0.0))
    # The first GET brought 1000 bytes; three more in a row brought none further.
    assert server.routes.gets("/flaky/weights.hdf5") == [None] + ["bytes=1000-"] * 3
    assert _entries(home) == []


def test_http_404_is_a_clear_error_and_caches_nothing(server, tiny, home):
    url = _serve(server, "half", {"options.json": tiny["options.json"]})  # no weights there
    with pytest.raises(hub.DownloadError, match=r"/half/weights.hdf5: HTTP 404 .*a folder URL ends with '/'"):
        resolve_model(url, progress=False)
    with pytest.raises(hub.DownloadError, match=r"/nothing/options.json: HTTP 404"):
        Elmo.load(f"{server.url}/nothing/")
    assert _entries(home) == []


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "mismatched", "options"])
def test_bad_bodies_are_refused_and_cache_nothing(server, tiny, home, damage):
    files = dict(tiny)
    w = tiny["weights.hdf5"]
    if damage == "truncated":  # a short file, served with its own (short) length
        files["weights.hdf5"] = w[: len(w) // 2]
        expected = r"not a valid model: .*weights.hdf5"
    elif damage == "corrupted":  # the HDF5 header overwritten
        files["weights.hdf5"] = bytes(256) + w[256:]
        expected = r"not a valid model: .*/corrupted/weights.hdf5 is not a readable HDF5 file"
    elif damage == "mismatched":  # options of another model
        files["options.json"] = json.dumps({**TINY_OPTIONS, "lstm": {**TINY_OPTIONS["lstm"], "dim": 32}}).encode()
        expected = r"not a valid model: .*/mismatched/weights.hdf5: dataset .* has shape .* expected .* options"
    else:
        files["options.json"] = b'{"lstm": {"dim": 16'
        expected = r"not a valid model: .*/options/options.json is not valid JSON"
    url = _serve(server, damage, files)
    with pytest.raises(hub.DownloadError, match=expected + r".*nothing was cached"):
        resolve_model(url, progress=False)
    assert _entries(home) == []


def test_a_changed_cache_file_is_refused_on_later_use(server, tiny, home):
    url = _serve(server, "tamper", tiny)
    entry = resolve_model(url, progress=False)
    data = bytearray((entry / "weights.hdf5").read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in a weight value: only the sha256 can tell
    (entry / "weights.hdf5").write_bytes(bytes(data))
    redo = rf"delete {re.escape(str(entry))} and run `elmo-jax download {re.escape(url)}`"
    with pytest.raises(hub.ChecksumError, match=rf"weights.hdf5 has changed since it was downloaded .*{redo}"):
        resolve_model(url)
    with pytest.raises(hub.ChecksumError):
        Elmo.load(url)
    (entry / "weights.hdf5").unlink()
    with pytest.raises(hub.ChecksumError, match="weights.hdf5 is missing from the model cache"):
        resolve_model(url)
    assert len(server.routes.gets("/tamper/weights.hdf5")) == 1  # never silently fetched again


# -- offline ------------------------------------------------------------------------------
def test_offline_uses_the_cache_and_otherwise_says_which_files_to_put_where(server, tiny, monkeypatch, home, capsys):
    paths = _serve_released(server, "medium", tiny, monkeypatch, "offline")
    monkeypatch.setenv(hub.OFFLINE_ENV, "1")
    with pytest.raises(hub.OfflineError) as e:
        resolve_model("medium")
    entry = home / "models" / "medium"
    message = str(e.value)
    assert "not in the cache and offline mode is on (ELMO_JAX_OFFLINE=1)" in message
    for name, path in paths.items():
        assert f"{server.url}{path}\n    -> {entry / name}" in message
    assert server.routes.gets(paths["options.json"]) == [] and _entries(home) == []
    assert main(["download", "medium", "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("elmo-jax download: error: model 'medium' is not in the cache") and err.count("error") == 1

    # Following the message: the files put there by hand are checked, recorded and used.
    entry.mkdir(parents=True)
    (entry / "options.json").write_bytes(tiny["options.json"])
    with pytest.raises(hub.OfflineError, match=r"holds no weights.hdf5; put the model's files there"):
        resolve_model("medium")
    (entry / "weights.hdf5").write_bytes(tiny["weights.hdf5"])
    assert resolve_model("medium") == entry
    manifest = json.loads((entry / "download.json").read_text())
    assert manifest["origin"] == "placed in the cache by hand"
    assert manifest["sha256"]["weights.hdf5"] == _sha(tiny["weights.hdf5"])
    assert server.routes.gets(paths["options.json"]) == []


def test_unreachable_network_uses_the_cache_or_gives_one_clear_error(server, tiny, monkeypatch, home):
    paths = _serve_released(server, "original", tiny, monkeypatch, "reach")
    assert resolve_model("original", progress=False) == home / "models" / "original"
    closed = _closed_port_url()
    monkeypatch.setenv(hub.MODELS_URL_ENV, closed)  # nothing listens there
    assert resolve_model("original") == home / "models" / "original"  # cached: no network needed
    assert resolve_model("original", offline=True) == home / "models" / "original"
    with pytest.raises(
        hub.OfflineError,
        match=r"model 'small' is not in the cache and the network is unreachable "
        r"\(.*refused.*\); put these files there:\n  " + re.escape(closed),
    ):
        resolve_model("small")
    with pytest.raises(
        hub.OfflineError,
        match=r"not in the cache and offline mode is on; download "
        r"http://\S+/m.zip, extract it",
    ):
        resolve_model(f"{server.url}/m.zip", offline=True)
    assert _entries(home) == ["original"]
    assert len(server.routes.gets(paths["weights.hdf5"])) == 1


def _closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/"


# -- archives -----------------------------------------------------------------------------
def _archive(kind: str, members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
    else:
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_archives_are_extracted_into_one_cache_entry(server, tiny, home, kind):
    members = {
        "ru/elmo_ru_options.json": tiny["options.json"],
        "ru/elmo_ru_weights.hdf5": tiny["weights.hdf5"],
        "ru/vocab.txt": b"<S>\n</S>\n<UNK>\n",
        "README": b"not part of the model\n",
    }
    server.routes.files[f"/arch/ru.{kind}"] = _archive(kind, members)
    url = f"{server.url}/arch/ru.{kind}"
    entry = resolve_model(url, progress=False)
    assert sorted(p.name for p in entry.iterdir()) == ["download.json", "options.json", "vocab.txt", "weights.hdf5"]
    assert (entry / "weights.hdf5").read_bytes() == tiny["weights.hdf5"]
    assert json.loads((entry / "download.json").read_text())["urls"] == {"archive": url}
    assert Elmo.load(url).config == ElmoConfig.from_options(TINY_OPTIONS)
    assert len(server.routes.gets(f"/arch/ru.{kind}")) == 1
    assert _entries(home) == [entry.name]  # no extraction folder left behind

    # A model file named only by its suffix (model.hdf5) is found too; a broken archive is refused.
    server.routes.files[f"/arch/plain.{kind}"] = _archive(
        kind, {"options.json": tiny["options.json"], "model.hdf5": tiny["weights.hdf5"]}
    )
    assert (resolve_model(f"{server.url}/arch/plain.{kind}", progress=False) / "weights.hdf5").exists()
    server.routes.files[f"/arch/broken.{kind}"] = b"this is not an archive" * 10
    with pytest.raises(hub.DownloadError, match=rf"broken.{kind} is not a readable .* archive"):
        resolve_model(f"{server.url}/arch/broken.{kind}", progress=False)
    server.routes.files[f"/arch/empty.{kind}"] = _archive(kind, {"vocab.txt": b"a\n"})
    with pytest.raises(
        hub.DownloadError,
        match="expected one folder with an options .json file in the archive, found none; nothing was cached",
    ):
        resolve_model(f"{server.url}/arch/empty.{kind}", progress=False)
    assert len(_entries(home)) == 2


MANYLANGS = Path(__file__).parent / "data" / "manylangs" / "zip"  # made by the package (tests/peer_manylangs.py)


def test_an_elmoformanylangs_folder_url_is_fetched_file_by_file_and_converted(server, home):
    """No options.json there: config.json, the architecture it names, the .dic and .pkl files."""
    files = {p.name: p.read_bytes() for p in MANYLANGS.iterdir()}
    url = _serve(server, "efml", files)
    entry = hub.resolve_model(url, progress=False)
    assert {"options.json", "weights.hdf5", "char.dic", "word.dic"} <= {p.name for p in entry.iterdir()}
    for name in files:
        assert len(server.routes.gets(f"/efml/{name}")) == 1, name
    sentences = [["the", "cat", "sat"], ["中文", "Ω"]]
    np.testing.assert_array_equal(
        Elmo.load(url).embed(sentences, layers="all")[1], Elmo.load(MANYLANGS).embed(sentences, layers="all")[1]
    )
    assert not (home / hub.PARTIAL_DIR / entry.name).exists()  # the fetched files went with the staging
    assert [e for e in _entries(home) if not e.startswith("manylangs-")] == [entry.name]

    with pytest.raises(
        ValueError,
        match=r"'config.json'.*the folder's URL ending in '/' \(also for an "
        r"ELMoForManyLangs",
    ):
        hub.model_source(url + "config.json")  # the folder is the model, not its config.json
    # A file the model needs that the folder lacks is named; nothing is cached.
    url = _serve(server, "efml-half", {k: v for k, v in files.items() if k != "encoder.pkl"})
    with pytest.raises(
        hub.DownloadError,
        match=r"efml-half/encoder.pkl: HTTP 404.*holds an ELMoForManyLangs "
        r"config.json but not encoder.pkl",
    ):
        hub.resolve_model(url, progress=False)
    assert not any(p.name.startswith("efml-half") for p in (home / "models").iterdir())
    # A folder with neither kind of model says both were looked for.
    with pytest.raises(
        hub.DownloadError,
        match=r"/nothing-here/options.json: HTTP 404.*nor does the folder hold "
        r"an ELMoForManyLangs config.json",
    ):
        hub.resolve_model(f"{server.url}/nothing-here/", progress=False)
    # A config.json that is not ELMoForManyLangs' (no 'config_path') is named as such.
    url = _serve(server, "other-config", {"config.json": b'{"hidden_size": 8}'})
    with pytest.raises(
        hub.DownloadError,
        match=r"other-config/config.json is neither options.json's folder nor an ELMoForManyLangs "
        r"config.json with a 'config_path' \(KeyError",
    ):
        hub.resolve_model(url, progress=False)


# -- concurrency --------------------------------------------------------------------------
def test_two_processes_fetching_one_model_download_it_once(server, tiny, home):
    url = _serve(server, "race", tiny)
    hold = server.routes.hold["/race/weights.hdf5"] = threading.Event()
    script = (
        "import sys; from elmo_jax.hub import resolve_model; print('ready', flush=True); "
        "print(resolve_model(sys.argv[1]), flush=True)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def start():
        return subprocess.Popen(
            [sys.executable, "-c", script, url], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    first = start()
    try:
        wait_for("the first process's weights request", lambda: server.routes.gets("/race/weights.hdf5"))
        second = start()
        try:
            assert second.stdout.readline() == "ready\n"
            # The event: the second one says it waits for the lock (a line it writes just
            # before blocking), not a guess of how long it takes to get there.
            said = []
            for line in second.stderr:
                said.append(line)
                if "waiting for another process fetching" in line:
                    break
            assert len(server.routes.gets("/race/options.json")) == 1
            hold.set()
            out1, err1 = first.communicate(timeout=60)
            out2, err2 = second.communicate(timeout=60)
            err2 = "".join(said) + err2
        finally:
            second.kill()
    finally:
        hold.set()
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    entry = home / "models" / hub.model_source(url).key
    assert out1.split() == ["ready", str(entry)] and out2.split() == [str(entry)]
    assert "waiting for another process fetching" in err2
    assert [len(server.routes.gets(f"/race/{n}")) for n in ("options.json", "weights.hdf5")] == [1, 1]
    assert hub.verify_entry(entry)["sha256"]["weights.hdf5"] == _sha(tiny["weights.hdf5"])
    assert _entries(home) == [entry.name]
