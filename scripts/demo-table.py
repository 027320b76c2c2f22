#!/usr/bin/env python3
"""Runs `specinfer generate` once per drafter on one prompt and prints one table: tokens/s, plain
decoding's tokens/s in the same process, the speedup (the one divided by the other), tokens per
round, nodes verified per round, whether the text equals plain decoding's, and the process's peak
resident memory.

Each drafter runs in its own process with --compare-plain: plain decoding right after it, on the
same loaded target, so a row's speedup compares two runs under the same conditions. The speedup
is computed from the two printed (rounded) tokens/s of its row. The plain row is a process without
a drafter, for its memory; its two tokens/s columns are its own.

The first drafter runs first and its text streams to stdout as it is generated; then the plain
process and the other drafters run, and the table follows. Progress goes to stderr. Used by
scripts/demo.

Usage: demo-table.py SPECINFER TARGET_SPEC PROMPT LABEL=DRAFTER_SPEC... [-- generate options]
"""

import os
import re
import subprocess
import sys
import tempfile


def run(cmd, stream=False):
    """Runs cmd; returns (exit code, stdout, stderr, peak RSS in MiB). With stream, its stdout is
    ours (the text shows as it is generated) and "" is returned for it."""
    sys.stdout.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=None if stream else out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode("utf-8", "replace"),
                err.read().decode("utf-8", "replace"), usage.ru_maxrss / 1024.0)


def stat(pattern, text, label):
    m = re.search(r"^\[" + label + r"\].*?" + pattern, text, re.M)
    return float(m.group(1)) if m else None


def row(label, tps, plain_tps, tpr, npr, same, rss):
    # Rounded first, so that the printed speedup is the printed tokens/s over the printed plain
    # tokens/s.
    tps, plain_tps = round(tps, 2), round(plain_tps, 2)
    speedup = tps / plain_tps if plain_tps > 0 else 0.0
    return (label, tps, plain_tps, speedup, tpr, npr, same, rss)


def run_drafter(base, label, spec, stream):
    """One drafter's process (with --compare-plain); returns its row or None."""
    quiet = [] if stream else ["--quiet"]
    if stream:
        print(f"{label}: the text as it is generated", file=sys.stderr, flush=True)
    rc, _, err, rss = run(base + ["--drafter", spec, "--compare-plain"] + quiet, stream)
    if rc != 0:
        sys.stderr.write(f"{label}: failed\n{err}")
        return None
    m = re.search(r"speedup over plain decoding: [\d.]+x \((\w+) output\)", err)
    tps = stat(r"([\d.]+) tokens/s", err, "speculative")
    plain_tps = stat(r"([\d.]+) tokens/s", err, "plain")
    tpr = stat(r"mean tokens per round ([\d.]+)", err, "speculative")
    npr = stat(r"([\d.]+) nodes verified", err, "speculative")
    if None in (tps, plain_tps, tpr, npr):
        sys.stderr.write(f"{label}: no statistics in its output\n{err}")
        return None
    r = row(label, tps, plain_tps, tpr, npr, m.group(1) if m else "?", rss)
    print(f"  {label}: {r[1]:.2f} tokens/s, plain {r[2]:.2f} tokens/s in the same process: "
          f"{r[3]:.2f}x", file=sys.stderr, flush=True)
    return r


def run_plain(base):
    """The process without a drafter; returns its row or None."""
    rc, _, err, rss = run(base + ["--quiet"])
    tps = stat(r"([\d.]+) tokens/s", err, "plain")
    if rc != 0 or tps is None:
        sys.stderr.write(f"plain: failed\n{err}")
        return None
    r = row("plain", tps, tps, 1.0, 0.0, "-", rss)
    print(f"  plain: {r[1]:.2f} tokens/s", file=sys.stderr, flush=True)
    return r


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

    drafter_rows = []
    plain = None
    for i, (label, spec) in enumerate(configs):
        r = run_drafter(base, label, spec, stream=i == 0)
        if r is None:
            return 1
        drafter_rows.append(r)
        if plain is None:  # plain decoding on its own, right after the streamed text
            plain = run_plain(base)
            if plain is None:
                return 1
    if plain is None:
        plain = run_plain(base)
        if plain is None:
            return 1

    print()
    print("| drafter | tokens/s | plain tokens/s, same process | speedup | tokens/round "
          "| nodes/round | same text as plain | peak memory |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for label, tps, plain_tps, speedup, tpr, npr, same, rss in [plain] + drafter_rows:
        print(f"| {label} | {tps:.2f} | {plain_tps:.2f} | {speedup:.2f}x | {tpr:.2f} | {npr:.2f} "
              f"| {same} | {rss:.0f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
