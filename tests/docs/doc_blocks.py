#!/usr/bin/env python3
"""The docs are tests: every shell block of README.md and docs/*.md runs.

Each fenced block whose info string starts with `sh` (or `bash`, `shell`) is one test:

    ```sh                              runs, with the default bound (DEFAULT_TIMEOUT_S)
    ```sh timeout=300                  runs, with its own bound in seconds
    ```sh no-run: needs a second host  does not run; the reason is required and printed

A block runs under `bash -e -o pipefail` in a fresh, empty directory with `fedfleet` on PATH
(the directory given by --bin), the Python package `fedfleet` importable (PYTHONPATH: the
directory given by --python, as if it were installed) and the repository's top-level folders (examples, scripts,
bench, docker, docs, python) linked into it, so that a block names files as the docs do
(`examples/configs/demo.toml`) and writes what it makes (`sim.db`) into its own directory. The
block gets nothing else: no variable is set for it, so a block is exactly what a reader types.

A block fails when it exits non-zero, when it runs past its bound (its whole process group is
killed and the failure says so), or when it leaves a background process running. Every block,
run or not, fails when a repository path it names (examples/..., scripts/..., ...) does not
exist. At the end it prints `N blocks run, M marked no-run` and exits 1 if anything failed.

    doc_blocks.py --repo DIR --bin DIR [--python DIR] [--only README.md[:N]] [--list] [--keep]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SHELLS = ("sh", "bash", "shell")
DEFAULT_TIMEOUT_S = 120
# Folders of the repository a block may name by a relative path.
LINKED = ("examples", "scripts", "bench", "docker", "docs", "python", "tests", "fuzz")
PATH_RE = re.compile(r"(?<![\w./-])(?:\./)?((?:" + "|".join(LINKED) + r")/[\w.+/-]*[\w+-])")


class Block:
    def __init__(self, doc, index, line, info, text):
        self.doc, self.index, self.line, self.info, self.text = doc, index, line, info, text
        self.no_run = None  # the reason, when marked no-run
        self.timeout = DEFAULT_TIMEOUT_S
        self.error = None  # a malformed info string
        rest = info[len(info.split()[0]):].strip() if info.split() else ""
        m = re.match(r"no-run\s*:?\s*(.*)$", rest)
        if m:
            self.no_run = m.group(1).strip()
            if not self.no_run:
                self.error = "marked no-run without a reason (write `sh no-run: <why>`)"
        elif rest:
            m = re.fullmatch(r"timeout=(\d+)", rest)
            if m:
                self.timeout = int(m.group(1))
            else:
                self.error = "unknown info string %r (sh, sh timeout=N, sh no-run: reason)" % info

    @property
    def name(self):
        return "%s:%d (block %d)" % (self.doc, self.line, self.index)


def blocks_of(repo, doc):
    """The fenced shell blocks of one markdown file, in order."""
    out = []
    fence = None
    info = ""
    start = 0
    lines = []
    count = 0
    with open(os.path.join(repo, doc), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if fence is None:
                m = re.match(r"^(```+|~~~+)\s*(.*)$", stripped)
                if m:
                    fence, info, start, lines = m.group(1), m.group(2).strip(), number, []
                continue
            if stripped.startswith(fence) and stripped.strip("`~") == "":
                word = info.split()[0] if info.split() else ""
                if word in SHELLS:
                    count += 1
                    out.append(Block(doc, count, start, info, "".join(lines)))
                fence = None
                continue
            lines.append(line)
    if fence is not None:
        raise SystemExit("%s:%d: a fenced block is never closed" % (doc, start))
    return out


def missing_paths(repo, block):
    """Repository paths the block names that do not exist."""
    missing = []
    for m in PATH_RE.finditer(block.text):
        path = m.group(1)
        if any(ch in path for ch in "*?{$"):
            continue
        if not os.path.exists(os.path.join(repo, path)):
            missing.append(path)
    return sorted(set(missing))


def run_block(repo, bindir, block, keep, pythondir=None):
    """Runs one block; returns (ok, seconds, message)."""
    work = tempfile.mkdtemp(prefix="fedfleet-doc-")
    for name in LINKED:
        if os.path.isdir(os.path.join(repo, name)):
            os.symlink(os.path.join(repo, name), os.path.join(work, name))
    env = dict(os.environ)
    env["PATH"] = os.path.abspath(bindir) + os.pathsep + env.get("PATH", "")
    env["HOME"] = work
    env.pop("PYTHONPATH", None)
    if pythondir:
        env["PYTHONPATH"] = os.path.abspath(pythondir)
    for var in ("FEDFLEET", "BUILD_DIR", "OUT", "ROUNDS"):
        env.pop(var, None)
    script = "set -e -o pipefail\n" + block.text
    log_path = os.path.join(work, ".block.log")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=block.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        seconds = time.monotonic() - t0
        # Whatever the block started and left behind is part of the failure.
        leftover = process_group_alive(proc.pid)
        kill_group(proc.pid)
        if timed_out:
            proc.wait()
    with open(log_path, "rb") as log:
        output = log.read().decode("utf-8", "replace")
    if timed_out:
        ok, msg = False, "ran past its bound of %d s (killed)" % block.timeout
    elif proc.returncode != 0:
        ok, msg = False, "exited %d" % proc.returncode
    elif leftover:
        ok, msg = False, "left a background process running (wait for it or stop it)"
    else:
        ok, msg = True, "ok"
    if not ok:
        tail = "\n".join(output.splitlines()[-40:])
        msg += "\n    --- output (last 40 lines) ---\n" + "\n".join(
            "    " + line for line in tail.splitlines())
    if keep:
        msg += "\n    (kept: %s)" % work
    else:
        shutil.rmtree(work, ignore_errors=True)
    return ok, seconds, msg


def process_group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_group(pgid):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and process_group_alive(pgid):
            time.sleep(0.05)


def documents(repo):
    docs = ["README.md"]
    docs += sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(repo, "docs"))
                   if f.endswith(".md"))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="the repository's root")
    ap.add_argument("--bin", required=True, help="the directory holding the fedfleet program")
    ap.add_argument("--python", help="the directory holding the Python package fedfleet")
    ap.add_argument("--only", action="append", default=[],
                    help="run only this document (DOC) or block (DOC:N), repeatable")
    ap.add_argument("--list", action="store_true", help="list the blocks, run nothing")
    ap.add_argument("--keep", action="store_true", help="keep each block's directory")
    args = ap.parse_args()
    repo = os.path.abspath(args.repo)
    if not os.access(os.path.join(args.bin, "fedfleet"), os.X_OK):
        raise SystemExit("no fedfleet program in %s" % args.bin)

    blocks = [b for doc in documents(repo) for b in blocks_of(repo, doc)]
    if args.only:
        def chosen(b):
            return any(o == b.doc or o == "%s:%d" % (b.doc, b.index) for o in args.only)
        blocks = [b for b in blocks if chosen(b)]
    failures, ran, skipped = [], 0, 0
    for b in blocks:
        if args.list:
            print("%-40s %s" % (b.name, "no-run: " + b.no_run if b.no_run is not None
                                else "timeout %d s" % b.timeout))
            continue
        problems = []
        if b.error:
            problems.append(b.error)
        missing = missing_paths(repo, b)
        if missing:
            problems.append("names paths that do not exist: " + ", ".join(missing))
        if b.no_run is not None:
            skipped += 1
            status = "FAIL" if problems else "no-run"
            print("%-6s %s: %s" % (status, b.name, b.no_run), flush=True)
        elif not problems:
            ran += 1
            ok, seconds, msg = run_block(repo, args.bin, b, args.keep, args.python)
            print("%-6s %s in %.1f s: %s" % ("ok" if ok else "FAIL", b.name, seconds, msg),
                  flush=True)
            if not ok:
                failures.append(b.name)
        else:
            print("FAIL   %s" % b.name, flush=True)
        for p in problems:
            print("    " + p)
            failures.append(b.name)
    if args.list:
        return 0
    print("%d blocks run, %d marked no-run" % (ran, skipped))
    if failures:
        print("failed: " + ", ".join(sorted(set(failures))))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
