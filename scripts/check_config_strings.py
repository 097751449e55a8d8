#!/usr/bin/env python3
"""Config choices are enums: no code outside common/config/ compares a config string.

A config key that names one of a fixed set of values is a config::Choice (common/config/
choice.h), parsed when the config is read, and compared as an enum; comparing one with a
string does not compile. This check covers what the types cannot: the keys that stay strings
(names, paths, codec specs, the model name) must not be branched on either, and a parse whose
failure is dropped (`if (auto x = parseX(s); x.isOk()) ...` with no else) is refused. It reads
common/config/config.h for the string-typed keys of each section and scans the product folders
for

  - `config.section.key == "..."` or `!=` (also through `config_`, and through a local
    reference to a section, `const auto& dc = config.data;` then `dc.key == "..."`);
  - `dataFormat() == "..."` (data::DataFormat is an enum);
  - `if (auto x = ...parse...(...); x.isOk())` not followed by an `else`.

    check_config_strings.py [--repo DIR]   exit 0 when none is found (beyond KNOWN), else 1
"""
import argparse
import os
import re
import sys

PRODUCT = ["engine", "client", "sim", "coordinator", "peer", "driver", "cli", "kernels"]

# Comparisons that stay, each with its reason: (path, the comparison's text).
KNOWN = {
    # A path: ":memory:" is SQLite's name for a database in memory, not a choice.
    ("cli/commands.cc", 'config.history.db != ":memory:"'),
    # The model registry (common/model) takes a model by name: the built-in names and
    # "torchscript" (a file the user names) are one namespace there, below the config.
    ("driver/data_files.cc", 'config.model.name == "torchscript"'),
}


def string_keys(repo):
    """{section member name: {keys held as std::string}} from common/config/config.h."""
    text = open(os.path.join(repo, "common/config/config.h"), encoding="utf-8").read()
    structs = {}
    for m in re.finditer(r"struct (\w+Section) \{(.*?)\n\};", text, re.S):
        structs[m.group(1)] = set(re.findall(r"^\s+std::string (\w+)", m.group(2), re.M))
    config = re.search(r"struct Config \{(.*?)\n\};", text, re.S).group(1)
    return {member: structs.get(kind, set())
            for kind, member in re.findall(r"^\s+(\w+Section) (\w+);", config, re.M)}


def followed_by_else(lines, i):
    """Whether the if statement starting on lines[i] has an else."""
    text = "\n".join(lines[i:])
    start = text.find("isOk())") + len("isOk())")
    j = start
    while j < len(text) and text[j] in " \t\n":
        j += 1
    if j < len(text) and text[j] == "{":
        depth = 0
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
            if depth == 0:
                break
    else:
        j = text.find(";", j) + 1
    return text[j:].lstrip().startswith("else")


def scan(repo):
    keys = string_keys(repo)
    compare = r'\s*(?:==|!=)\s*"'
    direct = re.compile(r"\b(?:config_?|c)\.(\w+)\.(\w+)" + compare)
    alias_def = re.compile(
        r"(?:const\s+)?(?:auto|config::\w+Section)\s*&\s*(\w+)\s*=\s*[\w.>-]*?\bconfig_?\.(\w+)\s*;")
    fmt = re.compile(r"dataFormat\(\)" + compare)
    dropped = re.compile(r"if \(auto (\w+) = [\w:]*parse\w*\(.*\); \1\.isOk\(\)\)")
    found = []
    for folder in PRODUCT:
        for root, _, files in os.walk(os.path.join(repo, folder)):
            for name in sorted(files):
                if not name.endswith((".cc", ".h", ".cu")):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, repo)
                lines = open(path, encoding="utf-8").read().split("\n")
                aliases = {}
                for i, line in enumerate(lines):
                    for a in alias_def.finditer(line):
                        aliases[a.group(1)] = a.group(2)
                    hits = []
                    for m in direct.finditer(line):
                        if m.group(2) in keys.get(m.group(1), set()):
                            hits.append(m.group(0))
                    for alias, section in aliases.items():
                        for m in re.finditer(r"\b" + alias + r"\.(\w+)" + compare, line):
                            if m.group(1) in keys.get(section, set()):
                                hits.append(m.group(0))
                    hits += [m.group(0) for m in fmt.finditer(line)]
                    if dropped.search(line) and not followed_by_else(lines, i):
                        hits.append(dropped.search(line).group(0) + " (no else)")
                    for h in hits:
                        full = line.strip()
                        if any(rel == k[0] and k[1] in full for k in KNOWN):
                            continue
                        found.append(f"{rel}:{i + 1}: {full}")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    found = scan(args.repo)
    for f in found:
        print(f)
    if found:
        print(f"{len(found)} comparison(s) of config strings or dropped parse failures outside "
              "common/config/: make the key a config::Choice, compare the enum it parses to, or "
              "handle the failure (see scripts/check_config_strings.py)")
        return 1
    print("config strings: none compared outside common/config/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
