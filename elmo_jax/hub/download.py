"""One file over HTTP into a local path: resumed with ``Range`` after a dropped connection
(and from the partial file an interrupted attempt left), retried while it makes progress, with
a progress bar."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from elmo_jax.version import __version__
from elmo_jax.atomic import write_json
from elmo_jax.hub.errors import DownloadError

# Seconds to wait before each retry after a dropped connection; a retry that brings new bytes
# starts the count again, so only this many failures in a row give up.
RETRY_DELAYS_S = (0.0, 1.0, 2.0, 4.0, 8.0)
TIMEOUT_S = 60.0
# Bytes per read of a response body: read1 returns what has arrived (up to this many), so the
# progress bar and the partial file move on a slow link too.
CHUNK_BYTES = 1 << 16
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError)


class Unreachable(Exception):
    """The very first connection of a download failed: no network (or no such host)."""


class NotFound(Exception):
    """HTTP 404 (or 410): the caller may try another name for the file."""

    def __init__(self, url: str, reason: str):
        super().__init__(url)
        self.url, self.reason = url, reason


def download(
    url: str, dest: Path, *, progress: bool, retry_delays_s: Sequence[float], timeout_s: float, first: bool = False
) -> Path:
    """``url`` into ``dest.part`` (kept when interrupted), then renamed to ``dest``.  Resumes
    with ``Range`` (guarded by ``If-Range``) both after a dropped connection and from a
    ``.part`` file an earlier, interrupted attempt left for the same URL; gives up after
    ``len(retry_delays_s) + 1`` attempts in a row that brought no new bytes."""
    part, meta_path = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")
    done, total, validator, failures = 0, None, None, 0
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("url") == url and part.exists():
            done, total, validator = part.stat().st_size, meta.get("total"), meta.get("validator")
    except (OSError, ValueError):
        pass
    if not done:
        part.unlink(missing_ok=True)
    most = 0  # the most bytes held so far: a retry counts as progress only if it gets further
    host = urllib.parse.urlsplit(url).hostname
    bar = None
    try:
        with open(part, "ab") as out:
            while True:
                headers = {"User-Agent": f"elmo-jax/{__version__}"}
                if done:
                    headers["Range"] = f"bytes={done}-"
                    if validator:
                        headers["If-Range"] = validator
                try:
                    with urllib.request.urlopen(
                        urllib.request.Request(url, headers=headers), timeout=timeout_s
                    ) as resp:
                        first = False
                        if done and not (resp.status == 206 and _range_start(resp) == done):
                            # The file changed (If-Range) or the server ignores Range: start over.
                            out.seek(0)
                            out.truncate()
                            done, total = 0, None
                            if bar is not None:
                                bar.reset()
                            if resp.status == 206:  # a part from elsewhere: ask for the whole file
                                continue
                        if total is None:
                            total = _total_size(resp, done)
                            validator = resp.headers.get("ETag") or resp.headers.get("Last-Modified")
                            write_json(meta_path, {"url": url, "total": total, "validator": validator})
                        if bar is None:
                            label = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] or dest.name
                            bar = progress_bar(label, total, done, progress)
                        read = getattr(resp, "read1", resp.read)
                        while chunk := read(CHUNK_BYTES):
                            out.write(chunk)
                            out.flush()
                            done += len(chunk)
                            bar.update(len(chunk))
                    if total is None or done == total:
                        break
                    if done > total:
                        _drop(part, meta_path)
                        raise DownloadError(f"{url}: received {done} bytes, more than the {total} announced")
                    problem = f"connection closed after {done} of {total} bytes"
                except urllib.error.HTTPError as e:
                    if e.code == 416 and total is not None and done == total:
                        break
                    if e.code == 416 and done:
                        _drop(part, meta_path)
                        raise DownloadError(
                            f"{url}: the server announced {total if total is not None else 'more'} bytes but holds "
                            f"only {done} (it refused the request for the rest: HTTP 416); the file on the server "
                            f"is shorter than its size says (an incomplete upload, or a proxy's cut copy). Nothing "
                            f"was cached; tell the host, or try another mirror"
                        ) from None
                    if e.code in (404, 410):
                        raise NotFound(url, e.reason) from None
                    if e.code < 500:
                        hint = " (check the model name or URL; a folder URL ends with '/')" if e.code == 403 else ""
                        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}{hint}") from None
                    problem = f"HTTP {e.code} {e.reason}"
                except _NETWORK_ERRORS as e:  # not OSErrors of the local disk: those stop at once
                    reason = getattr(e, "reason", e)
                    silent = isinstance(reason, (TimeoutError, socket.timeout)) or isinstance(e, TimeoutError)
                    if silent:
                        problem = (
                            f"{host} accepted the connection but sent nothing for {timeout_s:g} s (the server "
                            f"is not answering: overloaded or broken, not a missing network)"
                        )
                        if first:
                            raise DownloadError(f"{url}: {problem}; try again later") from None
                    elif first:
                        raise Unreachable(reason) from None
                    else:
                        problem = f"{type(e).__name__}: {reason}"
                failures = 0 if done > most else failures + 1
                most = max(most, done)
                if failures > len(retry_delays_s):
                    got = f"{done} of {total} bytes" if total else f"{done} bytes"
                    raise DownloadError(
                        f"{url}: gave up after {failures} attempts in a row without progress "
                        f"({problem}; got {got}, kept to resume from); try again later"
                    ) from None
                time.sleep(retry_delays_s[failures - 1] if failures else 0.0)
    finally:
        if bar is not None:
            bar.close()
    os.replace(part, dest)
    meta_path.unlink(missing_ok=True)
    return dest


def _drop(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def _range_start(resp) -> int | None:
    match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _total_size(resp, done: int) -> int | None:
    match = re.match(r"bytes \d+-\d+/(\d+)", resp.headers.get("Content-Range", ""))
    if match:
        return int(match.group(1))
    length = resp.headers.get("Content-Length")
    return done + int(length) if length and length.isdigit() else None


def progress_bar(name: str, total: int | None, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=name,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not enabled,
        file=sys.stderr,
    )


__all__ = ["RETRY_DELAYS_S", "TIMEOUT_S", "NotFound", "Unreachable", "download", "progress_bar"]
