"""Reading user text files: one line of bytes -> str, with an error that names the line.

A NUL byte (``\\x00``) is refused here, for every text this package reads (training text,
vocabulary files, ``elmo-jax embed`` input, sentences given to ``Elmo.embed``): it is
never a character of a word, it cannot be written to every output (HDF5 strings end at
it) and a file that holds one is almost always binary or damaged.  The refusal names the
file and line (or the sentence) and how to remove the bytes.
"""

from __future__ import annotations

from elmo_jax.errors import ElmoError


class TextEncodingError(ElmoError, ValueError):
    """A line of an input file that is not valid UTF-8 (or a file that is not text)."""


UTF8_BOM = "\ufeff"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The first bytes of every HDF5 file (weights, token caches), told apart from text."""
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
NUL = "\x00"
NUL_FIX = "remove the NUL bytes first, e.g. tr -d '\\000' < in.txt > clean.txt"


class NulByteError(TextEncodingError):
    """Text that holds a NUL byte (see the module docstring)."""


def nul_refusal(where: str, column: int) -> NulByteError:
    """The error for a NUL at 0-based ``column`` (byte or character) of ``where``
    (``"path, line 3"`` or ``"sentence 5"``)."""
    return NulByteError(
        f"{where}: holds a NUL byte (\\x00, at position {column}); text must not hold "
        f"NUL bytes (a binary or damaged file?): {NUL_FIX}"
    )


def refuse_nul(text: str, where: str) -> None:
    """Raise :func:`nul_refusal` if ``text`` holds a NUL character."""
    column = text.find(NUL)
    if column >= 0:
        raise nul_refusal(where, column)


def decode_line(raw: bytes, path: str, lineno: int) -> str:
    """``raw`` decoded as UTF-8; otherwise an error naming ``path``, the line and the fix.

    On line 1 a UTF-8 byte-order mark (which some Windows editors write) is dropped:
    otherwise it would become part of the first word and silently change its vectors.
    A NUL byte is refused (:class:`NulByteError`, module docstring).
    """
    column = raw.find(b"\x00")
    if column >= 0 and not (lineno == 1 and raw.startswith(UTF16_BOMS + (HDF5_SIGNATURE[:4],))):
        raise nul_refusal(f"{path}, line {lineno}", column)
    try:
        text = raw.decode("utf-8")
        return text[1:] if lineno == 1 and text.startswith(UTF8_BOM) else text
    except UnicodeDecodeError as e:
        if lineno == 1 and raw.startswith(HDF5_SIGNATURE[:4]):  # the rest may be cut at its \n
            raise TextEncodingError(
                f"{path} is an HDF5 file, not text: was a weight or token-cache file "
                f"given where a text file is expected (arguments swapped?)"
            ) from None
        if lineno == 1 and raw.startswith(UTF16_BOMS):
            raise TextEncodingError(
                f"{path} is UTF-16 text (it starts with a UTF-16 byte-order mark); "
                f"convert it to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)"
            ) from None
        raise TextEncodingError(
            f"{path}, line {lineno}: not valid UTF-8 ({e.reason} at byte {e.start} of the line); "
            f"convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)"
        ) from None
