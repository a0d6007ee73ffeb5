#!/usr/bin/env python3
"""File and function sizes of the workspace's library and binary code.

    python3 scripts/code_sizes.py [ROOT]

Counts lines of every `.rs` file under ROOT's crates, leaving out tests: the
`tests/` and `fuzz/` folders, `*_tests.rs` files and each `#[cfg(test)] mod`
block. A function's size is the lines from its `fn` line to its closing brace.
Prints the 50th, 90th and 99th percentiles and the largest of each, then the
ten longest functions. Brace matching ignores braces in strings and comments
only roughly; the figures are for comparing one tree with another.
"""

import os
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")
TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]")
SKIPPED_DIRS = {"target", "tests", "fuzz", ".git", "examples", "benches"}


def source_files(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        for name in files:
            if name.endswith(".rs") and not name.endswith("_tests.rs") and name != "build.rs":
                yield os.path.join(folder, name)


def strip_strings(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//")[0]


def block_end(lines, start):
    """The index of the line that closes the first brace opened at or after `start`."""
    depth, opened = 0, False
    for i in range(start, len(lines)):
        code = strip_strings(lines[i])
        if not opened and ";" in code and "{" not in code:
            return None  # a declaration without a body
        for ch in code:
            if ch == "{":
                depth, opened = depth + 1, True
            elif ch == "}":
                depth -= 1
                if opened and depth == 0:
                    return i
    return None


def measure(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    kept, functions, i = 0, [], 0
    while i < len(lines):
        if TEST_MOD.match(lines[i]):
            end = block_end(lines, i + 1)
            i = (end if end is not None else len(lines)) + 1
            continue
        kept += 1
        match = FN.match(lines[i])
        if match:
            end = block_end(lines, i)
            if end is not None:
                functions.append((end - i + 1, f"{path}::{match.group(6)}"))
        i += 1
    return kept, functions


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    files, functions = [], []
    for path in source_files(root):
        kept, found = measure(path)
        files.append((kept, os.path.relpath(path, root)))
        functions.extend((n, os.path.relpath(name, root)) for n, name in found)
    for label, sizes in (("file lines", files), ("function lines", functions)):
        values = [n for n, _ in sizes]
        print(f"{label}: {len(values)} counted, p50 {percentile(values, 50)}, "
              f"p90 {percentile(values, 90)}, p99 {percentile(values, 99)}, max {max(values)}")
    print("longest functions:")
    for n, name in sorted(functions, reverse=True)[:10]:
        print(f"  {n:4d}  {name}")


if __name__ == "__main__":
    main()
