"""Tensors from files written by ``torch.save``, read without torch (numpy only).

Two layouts exist and both are read:

* the zip layout (torch >= 1.6): a zip archive ``<name>/data.pkl`` (the pickled object, its
  tensors' storages named by persistent ids) with one member ``<name>/data/<key>`` of raw
  little-endian bytes per storage;
* the legacy layout (torch < 1.6, and ``_use_new_zipfile_serialization=False``; the layout
  of the ELMoForManyLangs models released in 2018): five things one after another in one
  file, four pickles (a magic number, the protocol version 1001, system info, the object)
  followed by the pickled list of storage keys, then each storage as an int64 element count
  and its raw bytes, in that list's order.

Only what a state dict holds is understood: ``OrderedDict``, tensors rebuilt by
``torch._utils._rebuild_tensor_v2`` / ``_rebuild_parameter`` and plain Python values; any
other global in the pickle is refused (:class:`TorchFileError`), so loading a file runs no
code from it.  Tensors come back as numpy arrays (bfloat16 as float32).
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile

import numpy as np
from numpy.typing import DTypeLike

from elmo_jax.errors import ElmoError

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001
_DTYPES: dict[str, DTypeLike] = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16",
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class TorchFileError(ElmoError, ValueError):
    """A file that is not a readable ``torch.save`` state dict."""


class _StorageType:
    """Stands for ``torch.<Kind>Storage`` in the pickle: the element dtype of a storage."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = _DTYPES[name]

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize

    def decode(self, raw: bytes) -> np.ndarray:
        if self.dtype == "bfloat16":
            return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        return np.frombuffer(raw, np.dtype(self.dtype).newbyteorder("<")).astype(self.dtype)


class _Storage:
    """A storage named in the pickle; its elements are read when the layout gives them."""

    array: np.ndarray | None  # None until the storage's bytes are read

    def __init__(self, kind: _StorageType, numel: int):
        self.kind, self.numel, self.array = kind, numel, None


class _TensorRef:
    """A tensor as the pickle describes it, made an array once its storage is read."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset = storage, int(offset)
        self.size, self.stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)

    def array(self) -> np.ndarray:
        storage, start = self.storage, 0
        if isinstance(storage, tuple):  # a legacy view: (storage, element offset)
            storage, start = storage
        data = storage.array
        offset = start + self.offset
        if not self.size:
            return data[offset].copy()
        end = offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) + 1 if all(self.size) else offset
        if end > data.size:
            raise TorchFileError(f"a tensor of shape {self.size} reaches past its storage of {data.size} elements")
        return np.lib.stride_tricks.as_strided(
            data[offset:], shape=self.size, strides=tuple(s * data.itemsize for s in self.stride)
        ).copy()


def _rebuild_tensor(storage, offset, size, stride, *_ignored) -> _TensorRef:
    return _TensorRef(storage, offset, size, stride)


def _rebuild_parameter(data, _requires_grad=None, _hooks=None, *_ignored):
    return data


_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    """Builds only what a state dict holds; storages become :class:`_Storage` entries of
    ``storages`` (key -> storage), filled by the caller."""

    def __init__(self, file, storages: dict):
        super().__init__(file, encoding="latin1")
        self.storages = storages

    def find_class(self, module: str, name: str):
        if module == "torch" and name in _DTYPES:
            return _StorageType(name)
        if (module, name) in _GLOBALS:
            return _GLOBALS[(module, name)]
        raise TorchFileError(
            f"the file pickles {module}.{name}, which a state dict of tensors does not "
            f"hold; only files saved with torch.save(model.state_dict()) are read"
        )

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise TorchFileError(f"unknown persistent id {pid!r} in the pickle")
        kind, key = pid[1], str(pid[2])
        if not isinstance(kind, _StorageType):
            raise TorchFileError(f"storage {key} has an unknown element type ({kind!r})")
        storage = self.storages.setdefault(key, _Storage(kind, int(pid[4])))
        view = pid[5] if len(pid) > 5 else None
        if view:  # a legacy view into a shared storage: (view key, element offset, elements)
            return (storage, int(view[1]))
        return storage


def load_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The ``{name: numpy array}`` a ``torch.save(state_dict)`` file holds, either layout."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"torch file not found: {path}") from None
    try:
        obj = _load_zip(raw) if zipfile.is_zipfile(io.BytesIO(raw)) else _load_legacy(raw)
        if not isinstance(obj, dict) or not all(isinstance(v, _TensorRef) for v in obj.values()):
            raise TorchFileError(f"it does not hold a state dict of tensors (found {type(obj).__name__})")
        return {str(k): v.array() for k, v in obj.items()}
    except TorchFileError as e:
        raise TorchFileError(f"{path}: {e}") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        struct.error,
        zipfile.BadZipFile,
        KeyError,
        ValueError,
        IndexError,
        TypeError,
        AttributeError,
    ) as e:
        raise TorchFileError(
            f"{path} is not a readable torch.save file ({type(e).__name__}: {e}); "
            f"an interrupted copy or download? copy it again"
        ) from None


def _load_zip(raw: bytes):
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        names = z.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pickles) != 1:
            raise TorchFileError(f"a torch zip file holds one data.pkl, this one {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        order = z.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
        if order != "little":
            raise TorchFileError(f"its storages are {order}-endian; only little-endian files are read")
        storages: dict[str, _Storage] = {}
        obj = _Unpickler(io.BytesIO(z.read(pickles[0])), storages).load()
        for key, s in storages.items():
            data = z.read(f"{prefix}data/{key}")
            if len(data) < s.numel * s.kind.itemsize:
                raise TorchFileError(f"storage {key} holds {len(data)} bytes, fewer than its {s.numel} elements need")
            s.array = s.kind.decode(data[: s.numel * s.kind.itemsize])
    return obj


def _load_legacy(raw: bytes):
    f = io.BytesIO(raw)
    if raw[257:262] == b"ustar":
        raise TorchFileError("this is torch's tar layout (torch < 0.1.10), which is not read")

    def header():  # plain ints and dicts: any global in them is refused
        return _Unpickler(f, {}).load()

    try:
        magic = header()
    except (pickle.UnpicklingError, EOFError, ValueError, TorchFileError):
        raise TorchFileError("neither a zip archive nor a legacy torch pickle (no magic number)") from None
    if magic != _LEGACY_MAGIC:
        raise TorchFileError("neither a zip archive nor a legacy torch pickle (wrong magic number)")
    if header() != _LEGACY_PROTOCOL:
        raise TorchFileError("an unknown legacy torch protocol version")
    if not header().get("little_endian", True):
        raise TorchFileError("its storages are big-endian; only little-endian files are read")
    storages: dict[str, _Storage] = {}
    obj = _Unpickler(f, storages).load()
    for key in header():  # the storages' keys, in the order their bytes follow
        s = storages[str(key)]
        (numel,) = struct.unpack("<q", f.read(8))
        data = f.read(numel * s.kind.itemsize)
        if len(data) < numel * s.kind.itemsize:
            raise TorchFileError(f"the file ends inside storage {key} (cut short?)")
        s.array = s.kind.decode(data)
    missing = [k for k, s in storages.items() if s.array is None]
    if missing:
        raise TorchFileError(f"storages {missing[:3]} have no data in the file")
    return obj
