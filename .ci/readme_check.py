#!/usr/bin/env python3
"""Run every command block of README.md and of the docs pages, in order, in a fresh clone: a block
that breaks is caught.

    python .ci/readme_check.py            # what CI runs (.ci/run, after the tests)
    python .ci/readme_check.py --quick    # the main job capped at --config.max_steps=100 (a local smoke run)
    python .ci/readme_check.py --list     # which blocks would run, which are skipped and why
    python .ci/readme_check.py --verbose  # and print every block's output
    python .ci/readme_check.py --only docs/flax.md   # one document's blocks (after README's, which make runs/tiny)

The documents are README.md, then the pages of mkdocs.yml's ``nav`` in its order, then any
other ``docs/*.md`` page: a page's blocks may use what an earlier page's made (``runs/tiny``
from the main job, ``exported/``).  A block whose code is identical to one that already ran
(a README block repeated in a guide) is not run again.

The clone is made from this checkout's HEAD (``git clone``), so only committed text is
checked.  ```` ```bash ```` blocks run with ``bash -e -o pipefail`` in the clone's root,
inside ``.venv`` once a block has made it (as a reader who typed the README's first command
would be); ```` ```python ```` blocks run as scripts with that environment's Python.  Blocks
in other languages (or none, e.g. the layout listing) are not commands and are ignored.

A block that cannot run here (it downloads a released model, needs several hosts, takes
hours) must say so just above it in the Markdown source::

    <!-- readme-check: skip: downloads a released model -->

and is then listed as skipped with that reason.  Every other block must succeed: one that
fails is reported with its line number, its output's tail and how to mark it.  The blocks
run offline as far as models go (``ELMO_JAX_OFFLINE=1``: a block that would download a model
fails at once) with their own model cache, and without the caller's ``PYTHONPATH``, so the
clone's own install is what runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAV_PAGE = re.compile(r"^\s*-\s*(?:[^:]+:\s*)?([\w./-]+\.md)\s*$")
MARK = re.compile(r"<!--\s*readme-check:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")
LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
QUICK_STEPS = 100
BLOCK_TIMEOUT_S = 1800


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    language: str  # bash | python
    code: str
    skip: str | None  # the reason, for a block marked skip
    source: str = "README.md"  # the document, relative to the repository

    @property
    def where(self) -> str:
        return f"{self.source} line {self.line}"


def documents(repo: str = REPO) -> list[str]:
    """README.md, then the docs pages in mkdocs.yml's nav order, then any other docs/*.md page
    (paths relative to ``repo``)."""
    docs_dir = os.path.join(repo, "docs")
    pages = []
    nav = os.path.join(repo, "mkdocs.yml")
    if os.path.exists(nav):
        with open(nav, encoding="utf-8") as f:
            pages = [m.group(1) for m in map(NAV_PAGE.match, f) if m]
    others = sorted(os.path.relpath(os.path.join(d, n), docs_dir) for d, _, names in os.walk(docs_dir)
                    for n in names if n.endswith(".md"))
    pages += [p for p in others if p not in pages]
    return ["README.md"] + [f"docs/{p}" for p in pages if os.path.exists(os.path.join(docs_dir, p))]


def parse_blocks(text: str, source: str = "README.md") -> list[Block]:
    """The command blocks of a Markdown text, with the skip mark just above each (if any)."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1).lower()
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{source} line {start + 1}: a code block that is never closed")
        if lang in LANGUAGES:
            above = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            mark = MARK.search(above)
            skip = None
            if mark and mark.group(1).startswith("skip"):
                skip = mark.group(1)[len("skip"):].lstrip(": ").strip()
                if not skip:
                    raise ValueError(f"{source} line {start}: a skip mark must give its reason "
                                     f"(<!-- readme-check: skip: REASON -->)")
            blocks.append(Block(start + 1, LANGUAGES[lang], "\n".join(lines[start + 1:j]), skip, source))
        i = j + 1
    return blocks


# What cannot run in CI: a block holding one of these must carry a skip mark (it is refused
# before anything runs otherwise).
CANNOT_RUN = {
    r"""Elmo\.load\(["'](small|medium|original|original-5\.5b)["']""": "loads a released model (a download)",
    r"elmo-jax download|--model (small|medium|original)\b|init_from=(small|medium|original)\b":
        "downloads a released model",
    r"https?://": "uses the network",
    r"\bsrun\b|gcloud |--coordinator|--num-processes": "needs several hosts",
    r"configs/(small|medium|original)\.py": "trains a large model (hours)",
    r"--config\.data=(lm1b|/)|my_text|my_corpus": "needs a corpus this repository does not have",
}


def refuse_unmarked(blocks: list[Block]) -> list[str]:
    """A line per unmarked block that cannot run here (see CANNOT_RUN)."""
    out = []
    for b in blocks:
        if b.skip:
            continue
        for pattern, why in CANNOT_RUN.items():
            if re.search(pattern, b.code):
                out.append(f"{b.where}: this block {why}, so it cannot run in the check; mark it "
                           f"just above with <!-- readme-check: skip: REASON -->")
                break
    return out


def quick_version(code: str) -> str:
    """The main job capped at QUICK_STEPS steps (``python train.py`` with no other argument)."""
    return re.sub(r"python train\.py(?=\s*$)", f"python train.py --config.max_steps={QUICK_STEPS}", code,
                  flags=re.MULTILINE)


def block_env(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(ELMO_JAX_OFFLINE="1", ELMO_JAX_HOME=os.path.join(home, "elmo-jax-cache"), PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg")
    return env


def run_block(block: Block, clone: str, env: dict[str, str], quick: bool) -> tuple[int, str, float]:
    venv = os.path.join(clone, ".venv")
    if block.language == "bash":
        code = quick_version(block.code) if quick else block.code
        activate = f"if [ -f {venv}/bin/activate ]; then . {venv}/bin/activate; fi\n"
        command = ["bash", "-e", "-o", "pipefail", "-c", activate + code]
    else:
        python = os.path.join(venv, "bin", "python") if os.path.exists(venv) else sys.executable
        command = [python, "-c", block.code]
    start = time.perf_counter()
    # Its own process group, so that a block cut off by the timeout leaves nothing running.
    proc = subprocess.Popen(command, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, output, time.perf_counter() - start


def load_blocks(repo: str = REPO, only: list[str] | None = None) -> list[Block]:
    """Every command block of ``documents(repo)`` (or of ``only``), in order."""
    blocks = []
    for doc in only or documents(repo):
        with open(os.path.join(repo, doc), encoding="utf-8") as f:
            blocks += parse_blocks(f.read(), doc)
    return blocks


def repeats(blocks: list[Block]) -> dict[int, Block]:
    """For each unmarked block whose code equals an earlier unmarked block's (by position in
    ``blocks``), that earlier block: it has run, so this one need not."""
    first: dict[tuple[str, str], Block] = {}
    out = {}
    for i, b in enumerate(blocks):
        if b.skip:
            continue
        key = (b.language, b.code.strip())
        if key in first:
            out[i] = first[key]
        else:
            first[key] = b
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", metavar="PATH",
                    help="check only this document (relative to the repository; repeatable), e.g. README.md")
    ap.add_argument("--quick", action="store_true",
                    help=f"cap the main job (`python train.py`) at --config.max_steps={QUICK_STEPS}")
    ap.add_argument("--list", action="store_true", help="list the blocks and what would happen to each")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--verbose", action="store_true", help="print every block's output, not only a failed one's")
    args = ap.parse_args(argv)
    blocks = load_blocks(REPO, args.only)
    refused = refuse_unmarked(blocks)
    if refused:
        print("\n".join(refused), file=sys.stderr)
        return 1
    again = repeats(blocks)
    if args.list:
        for i, b in enumerate(blocks):
            first = b.code.strip().split("\n")[0][:80]
            what = (f"SKIP ({b.skip})" if b.skip else f"SAME as {again[i].where}" if i in again else "run")
            print(f"{b.where:32s} {b.language:6s} {what}: {first}")
        return 0
    home = tempfile.mkdtemp(prefix="elmo-jax-readme-check-")
    clone = os.path.join(home, "elmo-jax")
    failed = []
    try:
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", REPO, clone], check=True)
        env = block_env(home)
        docs = len({b.source for b in blocks})
        print(f"README check: {len(blocks)} command blocks of {docs} documents, in a fresh clone at {clone}"
              f"{' (quick: main job capped at ' + str(QUICK_STEPS) + ' steps)' if args.quick else ''}", flush=True)
        for i, b in enumerate(blocks):
            if b.skip:
                print(f"{b.where}: skipped ({b.skip})", flush=True)
                continue
            if i in again:
                print(f"{b.where}: the same as {again[i].where}, not run again", flush=True)
                continue
            try:
                code, output, seconds = run_block(b, clone, env, args.quick)
            except subprocess.TimeoutExpired:
                code, output, seconds = -1, f"(no end after {BLOCK_TIMEOUT_S} s)", float(BLOCK_TIMEOUT_S)
            if args.verbose:
                print("\n".join("    " + s for s in output.rstrip().split("\n")), flush=True)
            if code == 0:
                print(f"{b.where}: ok in {seconds:.0f} s", flush=True)
                continue
            failed.append(b.where)
            tail = "\n".join("    " + s for s in output.rstrip().split("\n")[-25:])
            print(f"{b.where}: FAILED (exit status {code}) after {seconds:.0f} s:\n{tail}\n"
                  f"  fix the block, or, if it cannot run here, mark it just above in {b.source} with\n"
                  f"  <!-- readme-check: skip: REASON -->", flush=True)
    finally:
        if args.keep:
            print(f"the clone is kept at {clone}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    ran = sum(1 for i, b in enumerate(blocks) if not b.skip and i not in again)
    marked = sum(1 for b in blocks if b.skip)
    print(f"README check: {ran - len(failed)} of {ran} blocks ran; {marked} skipped (marked), {len(again)} repeats "
          f"not run again; {'FAILED at ' + ', '.join(failed) if failed else 'all good'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
