"""Models by name or URL: downloaded once into a local cache, returned as a folder that
:meth:`elmo_jax.Elmo.load` reads (``options.json`` + ``weights.hdf5``).  One module per job:
:mod:`~elmo_jax.hub.names` (specs -> URLs), :mod:`~elmo_jax.hub.download` (one file over HTTP),
:mod:`~elmo_jax.hub.manylangs_names`, :mod:`~elmo_jax.hub.archives`, :mod:`~elmo_jax.hub.verify`
(digests, architectures), :mod:`~elmo_jax.hub.lock` and :mod:`~elmo_jax.hub.cache` (the entries).
The hub reads no model file: preparing and checking what it fetched is the formats' job,
asked through :class:`~elmo_jax.hub.model_formats.ModelFormats`, which the resolver
(:mod:`elmo_jax.resolve`, the one place that knows the order) hands it.  This module keeps the names ``elmo_jax.hub`` always had.

    resolve_model("original")                            # a released English model
    resolve_model("https://host/models/elmo_x_")         # URL prefix: + options.json, + weights.hdf5
    resolve_model("https://host/models/x/")              # folder URL: x/options.json, x/weights.hdf5
    resolve_model("https://host/x/elmo_x_options.json")  # either file's URL: the other is beside it
    resolve_model("https://host/model.tar.gz")           # an archive (.zip, .tar.gz, .tgz) holding them
    resolve_model("path/to/folder")                      # an existing folder, returned as it is
    resolve_model("runs/tiny")                           # a training workdir: its newest checkpoint, exported

Names: ``small``, ``medium``, ``original``, ``original-5.5b``, the files AllenNLP points to,
under ``$ELMO_JAX_MODELS_URL`` (default ``https://allennlp.s3.amazonaws.com/models/elmo/``)
as ``<dir>/elmo_<dir>_options.json`` and ``<dir>/elmo_<dir>_weights.hdf5``.

Cache: ``$ELMO_JAX_HOME/models/<key>/`` (default ``$XDG_CACHE_HOME/elmo-jax``, else
``~/.cache/elmo-jax``); ``<key>`` is the name, or for a URL its last path part plus a hash
of the URL.  An entry holds ``options.json``, ``weights.hdf5`` (an archive's other files in
the model's folder too, e.g. an export's ``vocab.txt`` and ``softmax.hdf5``) and
``download.json``, the sha256 of every file recorded when it was downloaded and checked
on every later use.

A download goes into a temporary folder beside the entry; each file is resumed with an
HTTP ``Range`` request after a dropped connection; archives are extracted there; the
options and weights are checked against each other (by the formats it is handed),
and only then is the folder renamed into place, so an entry is complete or absent.  An
exclusive file lock (``fcntl.flock``) per entry serialises processes fetching the same
model: the second one waits and then uses the first one's copy.

ELMoForManyLangs models (:mod:`elmo_jax.formats.manylangs`): ``manylangs/<code>`` names the 44
released ones (``manylangs/fr``; ``$ELMO_JAX_MANYLANGS_URL`` replaces their host), and any
archive holding such a folder (``config.json``, ``char.dic``, ``word.dic``, the two ``.pkl``
files), or a folder URL whose folder holds them, is converted once, in the staging folder, and cached in this package's layout.

Trust: a URL may pin its file's digest as ``...#sha256=<hex>`` (the archive, or the weight
file for the other URL forms), checked after the download and on every later use.  The
entry of a released name fetched from its official host (no ``$ELMO_JAX_MODELS_URL`` /
``$ELMO_JAX_MANYLANGS_URL`` mirror) is checked against that model's known architecture on
every use, so a different model copied into its folder is refused.  An interrupted download
(Ctrl-C, a killed process, a dropped connection) keeps its partial file under
``<cache>/.partial/<key>/`` and the next attempt resumes it with ``Range``; ``force=True`` (``elmo-jax
download NAME --force``) deletes an entry (and any partial file) and fetches it afresh.

Offline (``offline=True`` or ``ELMO_JAX_OFFLINE=1``, or the network unreachable): a cached
entry is used; without one, :class:`OfflineError` says which files to put where.  Files put
there by hand are checked like a download and their sha256 recorded on first use.
"""

from elmo_jax.hub.cache import (
    HOME_ENV,
    OFFLINE_ENV,
    PARTIAL_DIR,
    cache_home,
    fetch,
    fetch_model,
    offline_from_env,
    partial_dir,
)
from elmo_jax.hub.download import RETRY_DELAYS_S, TIMEOUT_S
from elmo_jax.hub.errors import ChecksumError, DownloadError, OfflineError
from elmo_jax.hub.names import (
    ARCHIVE_SUFFIXES,
    DEFAULT_MODELS_URL,
    MODELS_URL_ENV,
    OPTIONS_FILE,
    RELEASED_MODELS,
    WEIGHTS_FILE,
    ModelSource,
    is_model_spec,
    is_url,
    model_source,
    released_names,
    unknown_name_message,
)
from elmo_jax.hub.verify import MANIFEST_FILE, verify_entry


def __getattr__(name: str):
    # resolve_model has always been elmo_jax.hub's; it now lives one layer up, in the resolver.
    if name == "resolve_model":
        from elmo_jax.resolve import resolve_model

        return resolve_model
    raise AttributeError(f"module 'elmo_jax.hub' has no attribute {name!r}")


__all__ = [
    "ARCHIVE_SUFFIXES",
    "DEFAULT_MODELS_URL",
    "HOME_ENV",
    "MANIFEST_FILE",
    "MODELS_URL_ENV",
    "OFFLINE_ENV",
    "OPTIONS_FILE",
    "PARTIAL_DIR",
    "RELEASED_MODELS",
    "RETRY_DELAYS_S",
    "TIMEOUT_S",
    "WEIGHTS_FILE",
    "ChecksumError",
    "DownloadError",
    "ModelSource",
    "OfflineError",
    "cache_home",
    "fetch",
    "fetch_model",
    "is_model_spec",
    "is_url",
    "model_source",
    "offline_from_env",
    "partial_dir",
    "released_names",
    "resolve_model",
    "unknown_name_message",
    "verify_entry",
]
