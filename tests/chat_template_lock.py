#!/usr/bin/env python3
"""Checks that Debian 12's Rust can still build tools/chat-template from its Cargo.lock, whatever
cargo updated the lock: the lock's format is version 3 (the latest that Debian 12's cargo reads),
the crate's rust-version is no later than Debian 12's rustc (1.63), and every package that cargo
builds for this platform declares a rust-version no later than the crate's. A build with a newer
Rust does not notice a dependency that moves past Debian's; this check does.
  chat_template_lock.py CRATE_DIR CARGO_METADATA_COMMAND...
CARGO_METADATA_COMMAND is `cargo metadata --locked --format-version 1 --filter-platform HOST
--manifest-path CRATE_DIR/Cargo.toml` (with whatever environment the build gives cargo)."""
import json
import os
import re
import subprocess
import sys

DEBIAN12_RUSTC = "1.63"


def version(text):
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    crate_dir, command = sys.argv[1], sys.argv[2:]
    with open(os.path.join(crate_dir, "Cargo.lock")) as f:
        lock = f.read()
    m = re.search(r"^version = (\d+)$", lock, re.M)
    problems = []
    if not m or int(m.group(1)) > 3:
        problems.append("Cargo.lock's format is later than version 3 (Debian 12's cargo reads "
                        "none later)")
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stderr, end="")
        print(f"FAIL: cargo metadata exited {run.returncode}")
        return 1
    metadata = json.loads(run.stdout)
    crate = next(p for p in metadata["packages"] if p["id"] == metadata["resolve"]["root"])
    limit = crate["rust_version"]
    if version(limit) > version(DEBIAN12_RUSTC):
        problems.append(f"the crate's rust-version {limit} is later than Debian 12's rustc "
                        f"{DEBIAN12_RUSTC}")
    for p in metadata["packages"]:
        needs = p.get("rust_version")
        if needs is None:
            print(f"note: {p['name']} {p['version']} declares no rust-version")
        elif version(needs) > version(limit):
            problems.append(f"{p['name']} {p['version']} needs Rust {needs}, the crate's "
                            f"rust-version is {limit}")
    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        print("Update the lock with `cargo update` in tools/chat-template (cargo >= 1.84).")
        return 1
    print(f"{len(metadata['packages'])} packages, all for Rust {limit}; Cargo.lock version 3")
    return 0


if __name__ == "__main__":
    sys.exit(main())
