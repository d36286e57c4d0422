"""Reading user text files: one line of bytes -> str, with an error that names the line."""

from __future__ import annotations

from elmo_jax.errors import ElmoError


class TextEncodingError(ElmoError, ValueError):
    """A line of an input file that is not valid UTF-8 (or a file that is not text)."""


UTF8_BOM = "\ufeff"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The first bytes of every HDF5 file (weights, token caches), told apart from text."""
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def decode_line(raw: bytes, path: str, lineno: int) -> str:
    """``raw`` decoded as UTF-8; otherwise an error naming ``path``, the line and the fix.

    On line 1 a UTF-8 byte-order mark (which some Windows editors write) is dropped:
    otherwise it would become part of the first word and silently change its vectors.
    """
    try:
        text = raw.decode("utf-8")
        return text[1:] if lineno == 1 and text.startswith(UTF8_BOM) else text
    except UnicodeDecodeError as e:
        if lineno == 1 and raw.startswith(HDF5_SIGNATURE[:4]):  # the rest may be cut at its \n
            raise TextEncodingError(f"{path} is an HDF5 file, not text: was a weight or token-cache file "
                                    f"given where a text file is expected (arguments swapped?)") from None
        if lineno == 1 and raw.startswith(UTF16_BOMS):
            raise TextEncodingError(f"{path} is UTF-16 text (it starts with a UTF-16 byte-order mark); "
                                    f"convert it to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)") from None
        raise TextEncodingError(
            f"{path}, line {lineno}: not valid UTF-8 ({e.reason} at byte {e.start} of the line); "
            f"convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)"
        ) from None
