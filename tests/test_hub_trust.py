"""elmo_jax.hub's trust: pinned digests, released architectures, resumed and forced downloads,
files placed by hand; each point tested against the HTTP
server of tests/test_hub.py on 127.0.0.1 (never the internet)."""

import io
import json
import shutil
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from elmo_jax import Elmo, hub
from elmo_jax.hub.verify import write_manifest
from elmo_jax.hub import download as hub_download
from elmo_jax.resolve import resolve_model

from elmo_jax.formats.downloads import DownloadFormats
from elmo_jax.hub import manylangs_names
from elmo_jax.cli import main
from tests.conftest import wait_for
from tests.test_hub import _entries, _serve, _sha, _tiny_model, home, server, tiny  # noqa: F401 - fixtures

MANYLANGS = Path(__file__).parent / "data" / "manylangs"


def test_a_bilm_tf_folder_loads_from_its_urls(server, tiny, home):
    url = _serve(server, "bilmtf", {"options.json": tiny["options.json"], "lm_weights.hdf5": tiny["weights.hdf5"]})
    entry = resolve_model(url, progress=False)
    assert (entry / "weights.hdf5").read_bytes() == tiny["weights.hdf5"]
    # the weight file's own URL is the same model: its options are the folder's options.json
    assert resolve_model(url + "lm_weights.hdf5", progress=False) == entry
    assert server.routes.gets("/bilmtf/lm_options.json") == []


def test_an_unknown_file_name_is_refused_and_tar_is_an_archive(server, tiny, home):
    with pytest.raises(ValueError, match=r"names the file 'model.bin', which is neither a model archive"):
        hub.model_source(f"{server.url}/x/model.bin")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in tiny.items():
            info = tarfile.TarInfo(f"m/{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    server.routes.files["/tarred/model.tar"] = buf.getvalue()
    entry = resolve_model(f"{server.url}/tarred/model.tar", progress=False)
    assert (entry / "weights.hdf5").read_bytes() == tiny["weights.hdf5"]
    assert server.routes.gets("/tarred/model.taroptions.json") == []


def test_a_misspelt_name_gets_the_closest_names():
    with pytest.raises(FileNotFoundError, match=r"did you mean 'original'.*released models: small, medium, original"):
        Elmo.load("orignal")
    with pytest.raises(ValueError, match=r"did you mean 'manylangs/fr'"):
        hub.model_source("manylangs/frr")


@pytest.mark.parametrize(
    "spec,meant",
    [
        ("manylangs/fii", "manylangs/fi"),
        ("manylangs/FI", "manylangs/fi"),
        ("manylang/fi", "manylangs/fi"),
        ("ManyLangs/de/", "manylangs/de"),
        ("manylangs/finnish", "manylangs/fi"),
        ("Small", "small"),
    ],
)
def test_a_misspelt_manylangs_name_that_looks_like_a_path_gets_the_closest_name(spec, meant, tmp_path, monkeypatch):
    """Every manylangs/<code> name holds a '/', so it reaches the 'no such folder' error."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"model folder not found") as e:
        Elmo.load(spec)
    assert f"did you mean {meant!r}?" in str(e.value)


def test_a_real_path_gets_no_name_suggestion(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for spec in ("models/elmo", "runs/a/small", str(tmp_path / "manylangs" / "fi")):
        with pytest.raises(FileNotFoundError, match=r"model folder not found") as e:
            Elmo.load(spec)
        assert "did you mean" not in str(e.value)


def test_a_released_name_is_checked_against_its_architecture(tiny, home, monkeypatch):
    monkeypatch.delenv(hub.MODELS_URL_ENV, raising=False)
    entry = home / "models" / "small"  # a 16/8 test model copied in by hand as "small"
    entry.mkdir(parents=True)
    for name, data in tiny.items():
        (entry / name).write_bytes(data)
    with pytest.raises(
        hub.ChecksumError, match=r"not those of the released model 'small' \(.*lstm.dim 16, released 1024"
    ):
        resolve_model("small", offline=True)
    assert not (entry / "download.json").exists()  # nothing recorded for a wrong model
    write_manifest(entry, hub.model_source("small"), downloaded=True)  # even with a manifest
    with pytest.raises(hub.ChecksumError, match=r"holds a model that is not the released 'small'"):
        Elmo.load("small")


def test_a_pinned_digest_is_checked_then_and_on_every_use(server, tiny, home):
    url = _serve(server, "pinned", tiny)
    wrong = "0" * 64
    with pytest.raises(hub.DownloadError, match=rf"sha256 {_sha(tiny['weights.hdf5'])}, not the pinned {wrong}"):
        resolve_model(f"{url}#sha256={wrong}", progress=False)
    assert _entries(home) == []
    entry = resolve_model(f"{url}#sha256={_sha(tiny['weights.hdf5'])}", progress=False)
    assert resolve_model(url, progress=False) == entry  # the same entry, pinned or not
    with pytest.raises(hub.ChecksumError, match=r"the pinned sha256 0{64} does not match"):
        resolve_model(f"{url}#sha256={wrong}")
    with pytest.raises(ValueError, match=r"#sha256=<64 hex digits>"):
        hub.model_source(f"{url}#md5=abc")


class _Interrupt:
    """A progress bar that raises KeyboardInterrupt (Ctrl-C) at its first update."""

    def __init__(self, *args, **kwargs):
        pass

    def update(self, n):
        raise KeyboardInterrupt

    def reset(self):
        pass

    def close(self):
        pass


class _Quiet(_Interrupt):
    def update(self, n):
        pass


def test_an_interrupted_download_keeps_its_part_and_resumes(server, tiny, home, monkeypatch, capsys):
    url = _serve(server, "ctrlc", tiny)
    monkeypatch.setattr(hub_download, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(hub_download, "progress_bar", _Interrupt)
    assert main(["download", url]) == 130
    err = capsys.readouterr().err
    assert "interrupted; the part already downloaded is kept" in err and "checkpoints" not in err
    part = hub.partial_dir(home / "models", hub.model_source(url).key) / "options.json.part"
    assert part.read_bytes() == tiny["options.json"][:1000]  # kept (the whole small file, not yet renamed)
    monkeypatch.setattr(hub_download, "progress_bar", _Quiet)
    entry = resolve_model(url)
    assert server.routes.gets("/ctrlc/options.json") == [
        None,
        f"bytes={part.stat().st_size if part.exists() else len(tiny['options.json'][:1000])}-",
    ]
    assert (entry / "options.json").read_bytes() == tiny["options.json"]
    assert not (home / hub.PARTIAL_DIR).exists()  # nothing left to resume


def test_a_killed_download_resumes_with_range(server, tiny, home, monkeypatch):
    url = _serve(server, "killed", tiny)
    monkeypatch.setattr(hub_download, "CHUNK_BYTES", 1000)
    bars = []

    class StopOnWeights(_Interrupt):
        def __init__(self, name, *a, **k):
            self.name = name
            bars.append(name)

        def update(self, n):
            if self.name == "weights.hdf5":
                raise KeyboardInterrupt

    monkeypatch.setattr(hub_download, "progress_bar", StopOnWeights)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(url)
    monkeypatch.setattr(hub_download, "progress_bar", _Quiet)
    entry = resolve_model(url)
    assert server.routes.gets("/killed/weights.hdf5") == [None, "bytes=1000-"]
    assert (entry / "weights.hdf5").read_bytes() == tiny["weights.hdf5"]


def test_a_server_that_never_answers_is_named(home):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections (the kernel does) and never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/m/"
        with pytest.raises(
            hub.DownloadError,
            match=r"127.0.0.1 accepted the connection but sent nothing for 0.5 s "
            r"\(the server is not answering",
        ):
            hub.fetch_model(
                hub.model_source(url), home / "models", formats=DownloadFormats(), progress=False, timeout_s=0.5
            )
    finally:
        listener.close()


def test_a_server_announcing_more_than_it_has_is_explained(server, tiny, home):
    url = _serve(server, "short", tiny)
    server.routes.announce_extra["/short/weights.hdf5"] = 100
    n = len(tiny["weights.hdf5"])
    with pytest.raises(hub.DownloadError, match=rf"announced {n + 100} bytes but holds only {n} .*HTTP 416\).*shorter"):
        hub.fetch_model(
            hub.model_source(url), home / "models", formats=DownloadFormats(), progress=False, retry_delays_s=(0.0,)
        )
    assert _entries(home) == [] and not (home / hub.PARTIAL_DIR).exists()


def test_the_body_arrives_in_small_chunks(server, tiny, home):
    url = _serve(server, "slow", tiny)
    release = threading.Event()
    server.routes.pause_after["/slow/weights.hdf5"] = (3000, release)
    done = []
    thread = threading.Thread(target=lambda: done.append(resolve_model(url, progress=False)))
    thread.start()
    try:
        part = hub.partial_dir(home / "models", hub.model_source(url).key) / "weights.hdf5.part"
        # the first 3000 bytes are on disk while the server still holds the rest back
        wait_for("the first bytes of a paused body", lambda: part.exists() and part.stat().st_size == 3000)
    finally:
        release.set()
        thread.join(60)
    assert done and (done[0] / "weights.hdf5").read_bytes() == tiny["weights.hdf5"]


def test_progress_can_be_turned_off(server, tiny, home, capfd):
    from flax import nnx

    from elmo_jax.nnx import ElmoLayer

    url = _serve(server, "quiet", tiny)
    Elmo.load(url, progress=False)
    assert "weights.hdf5" not in capfd.readouterr().err
    url2 = _serve(server, "quiet2", tiny)
    ElmoLayer(url2, progress=False, rngs=nnx.Rngs(0))
    assert "weights.hdf5" not in capfd.readouterr().err
    url3 = _serve(server, "loud", tiny)
    Elmo.load(url3)
    assert "weights.hdf5" in capfd.readouterr().err


def test_options_are_checked_before_the_weights_are_fetched(server, tiny, home):
    url = _serve(server, "badopts", {"options.json": b'{"lstm": {}}', "weights.hdf5": tiny["weights.hdf5"]})
    with pytest.raises(
        hub.DownloadError, match=r"badopts/options.json: missing section 'char_cnn'.*weight file was not"
    ):
        resolve_model(url, progress=False)
    assert server.routes.gets("/badopts/weights.hdf5") == []


def test_force_fetches_again_after_a_checksum_error(server, tiny, home, capsys):
    url = _serve(server, "forced", tiny)
    entry = resolve_model(url, progress=False)
    (entry / "weights.hdf5").write_bytes(b"damaged")
    with pytest.raises(hub.ChecksumError, match=r"`elmo-jax download .*--force`"):
        resolve_model(url)
    assert main(["download", url, "--force", "--no-progress"]) == 0
    assert (entry / "weights.hdf5").read_bytes() == tiny["weights.hdf5"]
    assert len(server.routes.gets("/forced/weights.hdf5")) == 2
    assert resolve_model(url, force=True, progress=False) == entry


def test_a_hand_placed_file_is_not_called_downloaded(tiny, home, monkeypatch, server):
    monkeypatch.setenv(hub.MODELS_URL_ENV, f"{server.url}/handmirror")
    entry = home / "models" / "medium"
    entry.mkdir(parents=True)
    for name, data in tiny.items():
        (entry / name).write_bytes(data)
    resolve_model("medium", offline=True)  # recorded on first use
    (home.parent / "other").mkdir()
    (entry / "weights.hdf5").write_bytes(_tiny_model(home.parent / "other", seed=3)["weights.hdf5"])
    with pytest.raises(hub.ChecksumError) as e:
        resolve_model("medium", offline=True)
    assert "since its sha256 was recorded on first use" in str(e.value)
    assert "placed in the cache by hand, not downloaded" in str(e.value)
    assert "since it was downloaded" not in str(e.value)


def test_a_failed_fetch_leaves_no_lock_file(server, home):
    with pytest.raises(hub.DownloadError):
        resolve_model(f"{server.url}/absent/", progress=False)
    assert list((home / "models" / ".locks").glob("*.lock")) == []


def test_download_list_names_every_released_model(capsys):
    assert main(["download", "--list"]) == 0
    out = capsys.readouterr().out
    assert "small" in out and "original-5.5b" in out
    assert "manylangs/fi" in out and "Finnish (149.zip)" in out and "manylangs/ur" in out
    assert out.count("manylangs/") == 44


def test_a_manylangs_name_downloads_converts_and_loads(server, home, monkeypatch, tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for f in sorted((MANYLANGS / "legacy").iterdir()):
            z.write(f, f"fr.model/{f.name}")
    server.routes.files["/nlpl/150.zip"] = buf.getvalue()
    monkeypatch.setenv(manylangs_names.URL_ENV, f"{server.url}/nlpl/")
    entry = resolve_model("manylangs/fr", progress=False)
    assert entry.name == "manylangs-fr"
    assert {"options.json", "weights.hdf5", "char.dic", "word.dic", "download.json"} <= {
        p.name for p in entry.iterdir()
    }
    assert json.loads((entry / "download.json").read_text())["archive_sha256"] == _sha(buf.getvalue())
    elmo = Elmo.load("manylangs/fr", progress=False)
    direct = Elmo.load(MANYLANGS / "legacy")
    import jax

    for a, b in zip(jax.tree.leaves(elmo.params), jax.tree.leaves(direct.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(server.routes.gets("/nlpl/150.zip")) == 1
    # From the official host, the released architecture is required: this tiny model is refused.
    monkeypatch.delenv(manylangs_names.URL_ENV)
    with pytest.raises(hub.ChecksumError, match=r"not the released 'manylangs/fr'"):
        resolve_model("manylangs/fr", offline=True)


def test_a_manylangs_folder_placed_by_hand_is_converted_and_recorded(home, monkeypatch, server):
    monkeypatch.setenv(manylangs_names.URL_ENV, f"{server.url}/nowhere/")  # a mirror: no architecture check
    with pytest.raises(hub.OfflineError, match=r"download http://\S+/nowhere/177.zip and unzip it into"):
        resolve_model("manylangs/ur", offline=True)
    entry = home / "models" / "manylangs-ur"
    shutil.copytree(MANYLANGS / "zip", entry)
    assert resolve_model("manylangs/ur", offline=True) == entry
    manifest = json.loads((entry / "download.json").read_text())
    assert manifest["origin"] == "placed in the cache by hand" and "weights.hdf5" in manifest["sha256"]
    assert Elmo.load("manylangs/ur", progress=False).config.vocab.n_words == 12
