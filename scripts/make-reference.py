#!/usr/bin/env python3
"""Dev-only: regenerate tests/data/reference/* from llama.cpp (via llama-cpp-python).

This script is not run by CI or the tests; it documents exactly how the committed reference data
was produced, so it can be regenerated or extended. Requirements (developer machine only):

    pip install llama-cpp-python==0.3.36     # builds llama.cpp from the sdist; on this project's
                                              # machines: CMAKE_ARGS="-DGGML_NATIVE=ON"
    scripts/fetch-models all                  # the GGUF files, sha256-verified

Usage:
    scripts/make-reference.py [--out tests/data/reference] [--models qwen2.5-coder-1.5b ...]

For each model it writes
  tokenizer_<model>.json  text -> token ids for a varied text set under three settings
                          (add_special false/true with parse_special true, and add_special false
                          with parse_special false), plus token id -> bytes (base64) for a sample
                          of ids, rendered with special=true and special=false, lstrip=0.
  logits_<model>.json     for a few fixed prompts: the prompt ids (tokenized with add_special=true,
                          parse_special=true), and for every prompt position the top-1 id and the
                          top-10 (id, logit) pairs of the next-token logits, plus a greedy
                          continuation of 32 tokens (argmax of the raw logits, no sampler), each
                          step with its top-2 (id, logit) so that tests can recognise near-ties.
                          llama.cpp settings: n_ctx 512, n_batch 512, n_threads 2, logits_all,
                          flash attention off, whole prompt evaluated as one batch, greedy steps
                          evaluated one token at a time.

Note on numerics: llama.cpp's CPU backend quantizes activations (to Q8_K / Q8_0 / Q8_1,
depending on the weight type) before quantized dot products and may use repacked weight layouts,
so an independent implementation is not expected to match the logits bit for bit; compare with a
tolerance and check top-1 agreement except where the top-1/top-2 gap is small.
"""

import argparse
import base64
import datetime
import json
import os
import random
import subprocess
import sys

import numpy as np

import llama_cpp
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FETCH = os.path.join(ROOT, "scripts", "fetch-models")

TEXTS = [
    "",
    " ",
    "Hello, world!",
    "hello world",
    " Hello",
    "  two leading spaces",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done what we'd've said; it's John's, isn't it? I'M LOUD. We'RE",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "#include <stdio.h>\n\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const add = (a, b) => a + b; // arrow\nconsole.log(`sum=${add(1, 2)}`);",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"héllo\")\n}\n",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "12345678901234567890 3.14159265358979 0.000001 1,000,000 2024-01-31 v1.2.3 0x1F",
    "7 77 777 7777 77777 1e5 -42",
    "Ünïcödé àccénts: café naïve résumé Ærøskøbing straße",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트.",
    "Emoji: 😀👍🏽 🇩🇪 👨‍👩‍👧‍👦 ❤️ and a snowman ☃",
    "Mixed العربية עברית Ελληνικά кириллица हिन्दी ไทย",
    "tabs\tand\t\ttabs\t\t\tend",
    "lines\n\nparagraph\n\n\n\nmore\r\nwindows\r\n",
    "     \n\t   \n  trailing spaces and newlines   \n\n",
    "                                        (40 spaces before this)",
    "a\u00a0non-breaking\u2009thin\u200bzero-width space",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a sort function.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
    "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<eos> <pad> <unk> and a fake <|not_special|> token",
    "Special-looking but plain: <im_start> [INST] </s> <s>",
    "x" * 64,
    "!!!???... ---- ==== **** ____ ~~~~ ####",
    "café\u0301 e\u0301 (combining)",
]

PROMPTS = [
    ("code_python", "def quicksort(arr):\n    \"\"\"Sort a list of numbers using quicksort.\"\"\"\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[len(arr) // 2]\n"),
    ("code_c", "/* Compute the greatest common divisor of two integers. */\nint gcd(int a, int b) {\n    while (b != 0) {\n"),
    ("prose", "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg"),
    ("chat", "<|im_start|>user\nWrite a function that reverses a string in JavaScript.<|im_end|>\n<|im_start|>assistant\n"),
]
GEMMA_CHAT = "<start_of_turn>user\nWrite a function that reverses a string in JavaScript.<end_of_turn>\n<start_of_turn>model\n"

N_CTX = 512
N_THREADS = 2
TOP_K = 10
N_GREEDY = 32


def model_path(name):
    r = subprocess.run([sys.executable, FETCH, "--print-path", name], stdout=subprocess.PIPE, text=True)
    path = r.stdout.strip()
    if r.returncode != 0:
        sys.exit(f"{name} is not fetched; run scripts/fetch-models {name}")
    return path


def sha256_of(name):
    with open(os.path.join(ROOT, "scripts", "models.json"), encoding="utf-8") as f:
        return json.load(f)["models"][name]["sha256"]


def piece(vocab, tok, special):
    buf = (llama_cpp.ctypes.c_char * 256)()
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, special)
    if n < 0:
        raise RuntimeError(f"token {tok}: piece longer than {len(buf)} bytes")
    return bytes(buf[:n])


def tokenize(llm, text, add_special, parse_special):
    return llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)


def meta(name, llm):
    return {
        "model": name,
        "model_sha256": sha256_of(name),
        "generator": "scripts/make-reference.py",
        "llama_cpp_python": llama_cpp.__version__,
        "date": datetime.date.today().isoformat(),
        "n_vocab": llm.n_vocab(),
    }


def make_tokenizer(name, path):
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    cases = []
    used = set()
    for text in TEXTS:
        case = {"text": text}
        for key, add_special, parse_special in (("ids", False, True),
                                                ("ids_add_special", True, True),
                                                ("ids_no_parse_special", False, False)):
            ids = tokenize(llm, text, add_special, parse_special)
            case[key] = ids
            used.update(ids)
        cases.append(case)

    n_vocab = llm.n_vocab()
    rng = random.Random(1234)
    sample = set(range(0, 300))
    sample.update(rng.sample(range(n_vocab), 400))
    sample.update(range(n_vocab - 40, n_vocab))
    sample.update(used)
    if n_vocab == 151936:  # Qwen2 specials and the first padding ids
        sample.update(range(151640, 151680))
    else:  # Gemma: control / turn / image tokens
        sample.update([105, 106, 255999, 256000, 262143])
    pieces = []
    for tok in sorted(sample):
        p_special = piece(vocab, tok, True)
        p_plain = piece(vocab, tok, False)
        pieces.append([tok, base64.b64encode(p_special).decode("ascii"),
                       base64.b64encode(p_plain).decode("ascii")])
    out = meta(name, llm)
    out.update({
        "settings": {
            "ids": "add_special=false, parse_special=true",
            "ids_add_special": "add_special=true, parse_special=true",
            "ids_no_parse_special": "add_special=false, parse_special=false",
            "pieces": "[id, base64(token_to_piece(special=true, lstrip=0)), base64(token_to_piece(special=false, lstrip=0))]",
        },
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "cases": cases,
        "pieces": pieces,
    })
    del llm
    return out


def top(row, k):
    idx = np.argpartition(-row, k)[:k]
    idx = idx[np.argsort(-row[idx], kind="stable")]
    return [[int(i), round(float(row[i]), 4)] for i in idx]


def make_logits(name, path):
    llm = Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=N_THREADS,
                n_threads_batch=N_THREADS, logits_all=True, flash_attn=False, seed=0, verbose=False)
    gemma = llm.n_vocab() != 151936
    prompts = []
    for pname, text in PROMPTS:
        if gemma and pname == "chat":
            text = GEMMA_CHAT
        ids = tokenize(llm, text, True, True)
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[:len(ids)], dtype=np.float32)
        positions = []
        for p in range(len(ids)):
            t = top(scores[p], TOP_K)
            positions.append({"top1": t[0][0], "top": t})
        greedy = []
        greedy_top2 = []
        last = scores[len(ids) - 1]
        for _ in range(N_GREEDY):
            t2 = top(last, 2)
            tok = t2[0][0]
            greedy.append(tok)
            greedy_top2.append(t2)
            llm.eval([tok])
            last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        prompts.append({
            "name": pname,
            "text": text,
            "ids": ids,
            "positions": positions,
            "greedy": greedy,
            "greedy_top2": greedy_top2,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", "replace"),
        })
        print(f"  {pname}: {len(ids)} prompt tokens; greedy: {prompts[-1]['greedy_text']!r}", flush=True)
    out = meta(name, llm)
    out.update({
        "settings": {
            "n_ctx": N_CTX, "n_batch": N_CTX, "n_threads": N_THREADS, "logits_all": True,
            "flash_attn": False, "prompt_tokenization": "add_special=true, parse_special=true",
            "positions": "positions[p] describes the next-token logits after ids[0..p]",
            "top": f"top {TOP_K} [id, logit] by descending logit, logits rounded to 4 decimals",
            "greedy": f"{N_GREEDY} tokens, argmax of raw logits, one token per eval",
        },
        "prompts": prompts,
    })
    del llm
    return out


def dump(obj, path):
    """Writes obj as JSON with one top-level key per line and one list entry (case, piece, prompt
    position) per line, so that diffs stay readable while the files stay small."""
    def enc(x):
        return json.dumps(x, ensure_ascii=False, separators=(",", ":"))

    def block(key, value, indent):
        pad = " " * indent
        if isinstance(value, list) and value and isinstance(value[0], (dict, list)) \
                and key in ("cases", "pieces", "positions", "greedy_top2"):
            inner = (",\n").join(pad + "  " + enc(v) for v in value)
            return f"{pad}{enc(key)}:[\n{inner}\n{pad}]"
        if isinstance(value, list) and value and isinstance(value[0], dict):
            inner = (",\n").join(obj_lines(v, indent + 2) for v in value)
            return f"{pad}{enc(key)}:[\n{inner}\n{pad}]"
        return f"{pad}{enc(key)}:{enc(value)}"

    def obj_lines(o, indent):
        pad = " " * indent
        body = (",\n").join(block(k, v, indent + 1) for k, v in o.items())
        return f"{pad}{{\n{body}\n{pad}}}"

    with open(path, "w", encoding="utf-8") as f:
        f.write(obj_lines(obj, 0))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "reference"))
    ap.add_argument("--models", nargs="*",
                    default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma-3-270m"])
    ap.add_argument("--skip-logits", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.models:
        path = model_path(name)
        print(f"{name}: {path}", flush=True)
        tok = make_tokenizer(name, path)
        dump(tok, os.path.join(args.out, f"tokenizer_{name}.json"))
        if args.skip_logits:
            continue
        lg = make_logits(name, path)
        dump(lg, os.path.join(args.out, f"logits_{name}.json"))


if __name__ == "__main__":
    main()
