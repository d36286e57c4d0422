"""The input of ``elmo-jax embed``: one pass that checks and fingerprints the text file, then
groups of lines read back by byte offset.

A text file holds one sentence per line (UTF-8, tokens separated by whitespace; ``\\r\\n``
line ends are accepted, a final newline is optional; an empty line is an empty sentence).
:func:`scan_input` reads it once, in blocks, before anything is embedded: it counts the
lines, refuses the first bad one (not UTF-8, or more than ``max_tokens`` tokens) with its
line number, takes the file's SHA-256 (a resumed run compares it), and notes the byte
offset of every group start.  Groups are the lines ``[g * group_lines, (g + 1) * group_lines)``:
a function of line numbers only, so a resumed run or another process regroups identically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from elmo_jax.errors import ElmoError, refuse_symlink_loop
from elmo_jax.textio import decode_line

GROUP_LINES = 2048
MAX_TOKENS = 10_000


class BadInputLine(ElmoError, ValueError):
    """A line of the input that cannot be embedded (named by its 1-based number)."""


@dataclasses.dataclass(frozen=True)
class InputScan:
    path: str
    size: int
    mtime_ns: int
    sha256: str
    n_lines: int
    group_lines: int
    group_offsets: tuple[int, ...]  # byte offset of line g * group_lines, for every group g

    @property
    def n_groups(self) -> int:
        return len(self.group_offsets)

    def fingerprint(self) -> dict:
        return {
            "path": self.path,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "sha256": self.sha256,
            "lines": self.n_lines,
        }


def _open_input(path: str):
    refuse_symlink_loop(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"input file not found: {path}")
    if os.path.isdir(path):
        raise ElmoError(f"input {path} is a folder, not a text file")
    try:
        return open(path, "rb")
    except OSError as e:
        raise ElmoError(f"cannot read input file {path} ({e.strerror})") from None


def scan_input(path: str | os.PathLike, group_lines: int, max_tokens: int) -> InputScan:
    """Check every line of ``path`` and fingerprint it (module docstring); one pass, memory
    bounded by one line plus one offset per group."""
    path = os.path.abspath(os.fspath(path))
    if group_lines < 1:
        raise ValueError(f"group_lines must be >= 1, got {group_lines}")
    digest = hashlib.sha256()
    offsets: list[int] = []
    offset = lineno = 0
    with _open_input(path) as f:
        stat = os.fstat(f.fileno())
        try:
            for raw in f:
                if lineno % group_lines == 0:
                    offsets.append(offset)
                lineno += 1
                offset += len(raw)
                digest.update(raw)
                n = len(decode_line(raw, path, lineno).split())
                if n > max_tokens:
                    raise BadInputLine(
                        f"{path}, line {lineno}: {n} tokens, more than --max-tokens {max_tokens}: a line is one "
                        f"sentence; split the line into sentences, or raise --max-tokens if it really is one"
                    )
        except OSError as e:
            raise ElmoError(f"cannot read input file {path} ({e.strerror})") from None
    if lineno == 0:
        raise ElmoError(f"input file {path} is empty: expected one sentence per line")
    return InputScan(path, offset, stat.st_mtime_ns, digest.hexdigest(), lineno, group_lines, tuple(offsets))


def read_group(scan: InputScan, group: int) -> list[str]:
    """The stripped lines of group ``group`` (already checked by :func:`scan_input`)."""
    first = group * scan.group_lines
    n = min(scan.group_lines, scan.n_lines - first)
    out = []
    with _open_input(scan.path) as f:
        f.seek(scan.group_offsets[group])
        for k in range(n):
            raw = f.readline()
            out.append(decode_line(raw, scan.path, first + k + 1).strip())
    return out


def read_sentences(path: str | os.PathLike) -> list[str]:
    """Every stripped line of a UTF-8 text file (small inputs; errors name the line)."""
    scan = scan_input(path, group_lines=1 << 62, max_tokens=1 << 62)
    return read_group(scan, 0)
