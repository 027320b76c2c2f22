#!/usr/bin/env python3
"""Runs `specinfer generate` once per drafter on one prompt and prints one table: tokens/s,
speedup over plain decoding, tokens per round, nodes verified per round, whether the text equals
plain decoding's, and the process's peak resident memory.

Each drafter runs in its own process with --compare-plain, so its speedup is a ratio measured in
one run (the plain decoding right after it, on the same loaded target); the plain row is a process
without a drafter, for its memory. Used by scripts/demo.

Usage: demo-table.py SPECINFER TARGET_SPEC PROMPT LABEL=DRAFTER_SPEC... [-- generate options]
"""

import os
import re
import subprocess
import sys
import tempfile


def run(cmd):
    """Runs cmd; returns (exit code, stdout, stderr, peak RSS in MiB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode("utf-8", "replace"),
                err.read().decode("utf-8", "replace"), usage.ru_maxrss / 1024.0)


def stat(pattern, text, label):
    m = re.search(r"^\[" + label + r"\].*?" + pattern, text, re.M)
    return float(m.group(1)) if m else None


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    exe, target, prompt = argv[1:4]
    rest = argv[4:]
    extra = []
    if "--" in rest:
        extra = rest[rest.index("--") + 1:]
        rest = rest[:rest.index("--")]
    configs = [item.split("=", 1) for item in rest]
    base = [exe, "generate", "--target", target, "--prompt", prompt] + extra

    rows = []
    rc, _, err, rss = run(base + ["--quiet"])
    if rc != 0:
        sys.stderr.write(err)
        return 1
    rows.append(("plain", stat(r"([\d.]+) tokens/s", err, "plain"), 1.0, 1.0, 0.0, "-", rss))
    print(f"  plain: {rows[-1][1]:.2f} tokens/s", file=sys.stderr, flush=True)
    text = None
    for label, spec in configs:
        # The last configuration prints its text: what the demo shows.
        quiet = [] if (label, spec) == tuple(configs[-1]) else ["--quiet"]
        rc, out, err, rss = run(base + ["--drafter", spec, "--compare-plain"] + quiet)
        if rc != 0:
            sys.stderr.write(f"{label}: failed\n{err}")
            return 1
        if not quiet:
            text = out
        m = re.search(r"speedup over plain decoding: ([\d.]+)x \((\w+) output\)", err)
        tps = stat(r"([\d.]+) tokens/s", err, "speculative")
        tpr = stat(r"mean tokens per round ([\d.]+)", err, "speculative")
        npr = stat(r"([\d.]+) nodes verified", err, "speculative")
        rows.append((label, tps, float(m.group(1)) if m else None, tpr, npr,
                     m.group(2) if m else "?", rss))
        print(f"  {label}: {tps:.2f} tokens/s, {rows[-1][2]:.2f}x", file=sys.stderr, flush=True)

    if text is not None:
        print(text.rstrip("\n"))
        print()
    print("| drafter | tokens/s | speedup | tokens/round | nodes/round | same text as plain "
          "| peak memory |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for label, tps, speedup, tpr, npr, same, rss in rows:
        print(f"| {label} | {tps:.2f} | {speedup:.2f}x | {tpr:.2f} | {npr:.2f} | {same} "
              f"| {rss:.0f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
