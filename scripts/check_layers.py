#!/usr/bin/env python3
"""The layers of fedfleet's code, checked: every #include of a project header is an arrow from
the including folder to the included one, and each arrow must be one this file allows.

A folder is a top-level library folder (kernels, engine, peer, driver, coordinator, client,
sim, cli, python) or, under common/, one of its sub-folders (common/wire, common/data, ...;
the files directly in common/ are `common`, the base everything may use). A new arrow fails
the check with the file and line that makes it: either the code belongs in another folder, or
the arrow is a decision to write down here, with its reason.

    check_layers.py [--repo DIR]     exit 0 when every arrow is allowed, 1 otherwise
"""
import argparse
import os
import re
import sys

# What each folder may include, besides itself and `common`. Lower layers first.
ALLOWED = {
    "kernels": set(),
    "common": {"kernels"},
    "common/crypto": set(),
    "common/compress": {"kernels"},
    # The protocol builds and reads the stage messages the wire format defines.
    "common/secagg": {"common/crypto", "common/wire"},
    "common/privacy": {"common/crypto"},
    "common/history": set(),
    "common/transport": set(),
    "common/data": set(),
    # The wire format names the data spec (common/data) and codec specs it carries.
    "common/wire": {"common/data", "common/compress"},
    # The config checks codec specs, names the data formats (common/data's DataFormat enum),
    # and bounds what it sets by the data constants and by the wire's limits (frame size,
    # neighbours): enums and constants only, nothing linked.
    "common/config": {"common/compress", "common/data", "common/wire"},
    # Models read data sets and the loss named on the wire; checksums.
    "common/model": {"common/crypto", "common/data", "common/wire"},
    "engine": {"kernels", "common/compress", "common/crypto", "common/history",
               "common/privacy", "common/secagg", "common/wire"},
    "peer": {"kernels", "common/compress", "common/wire"},
    # What the coordinator and the simulator share: from a config to a run (options, the run's
    # model and data, the history, the engine driver, resume).
    "driver": {"kernels", "engine", "peer", "common/compress", "common/config", "common/crypto",
               "common/data", "common/history", "common/model", "common/privacy",
               "common/secagg", "common/wire"},
    "client": {"kernels", "peer", "driver", "common/compress", "common/config", "common/crypto",
               "common/data", "common/model", "common/privacy", "common/secagg",
               "common/transport", "common/wire"},
    "coordinator": {"kernels", "engine", "peer", "driver", "common/compress", "common/config",
                    "common/crypto", "common/data", "common/history", "common/model",
                    "common/transport", "common/wire"},
    # The simulator runs the engine and the client's pieces in one process: never the networked
    # coordinator (its sockets and HTTP server).
    "sim": {"kernels", "engine", "peer", "driver", "client", "common/compress", "common/config",
            "common/crypto", "common/data", "common/history", "common/model", "common/privacy",
            "common/secagg", "common/wire"},
    "cli": {"kernels", "engine", "peer", "driver", "client", "coordinator", "sim",
            "common/compress", "common/config", "common/crypto", "common/data", "common/history",
            "common/model", "common/transport", "common/wire"},
    # The Python package's native half binds the config, the simulators, the coordinator
    # service, the client runtime and the CLI's read commands, and gives the engine a Python
    # strategy as its aggregator and the client runtime a Python training loop: the top layer,
    # beside cli.
    "python": {"cli", "client", "coordinator", "sim", "engine", "common/config", "common/history",
               "common/model", "common/wire"},
}

# Arrows that exist today and are to go, each by file and header, with why they are still
# here. Nothing else may be added to this list without the same.
KNOWN = set()
TOP = ("kernels", "common", "engine", "peer", "driver", "coordinator", "client", "sim", "cli",
       "python")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    """The layer a repository path belongs to."""
    parts = path.split("/")
    if parts[0] == "common" and len(parts) > 2:
        return "common/" + parts[1]
    return parts[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), ".."))
    args = ap.parse_args()
    repo = os.path.abspath(args.repo)
    bad = []
    checked = 0
    known = 0
    for top in TOP:
        for root, _, files in os.walk(os.path.join(repo, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc", ".cu", ".cpp")):
                    continue
                path = os.path.relpath(os.path.join(root, name), repo)
                src = folder_of(path)
                with open(os.path.join(repo, path), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target.split("/")[0] not in TOP:
                        continue  # a generated header, or a system one in quotes
                    dst = folder_of(target)
                    checked += 1
                    if dst in (src, "common") or dst in ALLOWED.get(src, set()):
                        continue
                    if (path, target) in KNOWN:
                        known += 1
                        continue
                    line = text.count("\n", 0, m.start()) + 1
                    bad.append("%s:%d: %s -> %s (%s)" % (path, line, src, dst, target))
    for b in bad:
        print("layering: " + b)
    print("layering: %d includes checked, %d known to go, %d not allowed (scripts/check_layers.py "
          "lists the arrows)" % (checked, known, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
