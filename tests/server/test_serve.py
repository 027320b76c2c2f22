"""`specinfer serve` driven by the official openai package (and raw HTTP for exact bodies).

Greedy texts must equal what `specinfer generate` prints for the same prompt, with one client and
with several at once (they queue); stop strings cut the text before the first one, also while
streaming; bad requests get 400 with an OpenAI-style error; a full queue gets 429; a stream whose
client goes away is cancelled and does not hold up the next request. Several models served by name
(--model NAME=PATH): each answers as `specinfer generate` on it, with its own chat template and
metrics; an unknown name gets 404; a served model that is also another's draft model is loaded
once (the server's resident memory shows it). Every request has a timeout. Under the sanitizers
(SPECINFER_SANITIZED) the tests marked release_only, whose subject is a rendering, a memory
figure, a latency or a text compared with `specinfer generate` (exactness, which the library's
tests check under the sanitizers too) rather than the server's memory and threads, are skipped.
"""
import concurrent.futures
import json
import math
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import jinja2
import jinja2.sandbox
import jsonschema
import openai
import pytest

from conftest import CLI, SANITIZED, TIMEOUT, Server, generate, gguf_metadata, model_path

QWEN = "qwen2.5-coder-0.5b.gguf"
GEMMA = "gemma-3-270m.gguf"
N = 24
# The context of the qwen fixture's server: test_context_full_ends_with_length fills it, which
# under the sanitizers takes a minute per hundred tokens.
CTX = 256 if SANITIZED else 512
PROMPTS = ["def fibonacci(n):", "import numpy as np\n\ndef normalize(v):", "class Stack:\n"]
# Why tests that compare a text with `specinfer generate`'s (one more run of the model in the
# command, several times slower under the sanitizers) run in the release build only.
GENERATE_EQUALITY = "a text equal to specinfer generate's: exactness, not memory or threads"
GEMMA3_TEMPLATE = os.path.join(os.path.dirname(__file__), "data", "gemma3-chat-template.jinja")


def client(server, **kw):
    """An openai client of `server`; the server closes it before it stops (Server.stop)."""
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=TIMEOUT,
                      max_retries=0, **kw)
    server.clients.append(c)
    return c


def post(server, path, body):
    """(status, parsed JSON) of a raw POST; `body` is sent as is when it is a string."""
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(server, path):
    with urllib.request.urlopen(server.url + path, timeout=TIMEOUT) as r:
        return r.status, r.read().decode()


def metric(server, name, model=None):
    """The value of series `name` (labels in braces allowed) of `model` (default: the server's)."""
    _, text = get(server, "/metrics")
    base, _, labels = name.partition("{")
    labels = labels.rstrip("}")
    series = f'{base}{{model="{model or server.model}"' + (f",{labels}" if labels else "") + "}"
    m = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def printed(text):
    """`text` as `specinfer generate` prints it: ending in a newline."""
    return text if text.endswith("\n") else text + "\n"


@pytest.fixture(scope="module")
def qwen():
    target = f"gguf:path={model_path(QWEN)},n_ctx={CTX}"
    # Four requests generate at once (stepped together, prompts scored 8 tokens per step beside
    # the others' rounds); the texts must still be what `specinfer generate` prints.
    server = Server(["--target", target, "--drafter", "ngram", "--threads", "2", "--queue", "7",
                     "-n", "16", "--parallel", "4", "--prefill-chunk", "8"])
    server.target = target
    server.model = "qwen2.5-coder-0.5b"
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def reference(qwen):
    """Greedy texts of `specinfer generate` for PROMPTS, N tokens each."""
    return {p: generate(qwen.target, "ngram", p, N) for p in PROMPTS}


def test_health_and_models(qwen):
    assert json.loads(get(qwen, "/health")[1]) == {"status": "ok"}
    models = client(qwen).models.list()
    assert [m.id for m in models.data] == [qwen.model]


def test_completion_equals_generate(qwen, reference):
    c = client(qwen)
    for p in PROMPTS:
        r = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0)
        assert printed(r.choices[0].text) == reference[p]
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == N
        assert r.usage.prompt_tokens > 0


def test_streaming_equals_generate(qwen, reference):
    p = PROMPTS[0]
    stream = client(qwen).completions.create(model=qwen.model, prompt=p, max_tokens=N,
                                             temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks)
    assert printed(text) == reference[p]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_concurrent_clients_equal_generate(qwen, reference):
    """Eight clients at once (one runs, seven wait): each gets its own greedy text."""
    c = client(qwen)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]

    def run(i):
        p = prompts[i]
        if i % 2:
            s = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0,
                                     stream=True)
            return "".join(ch.choices[0].text for ch in s)
        return c.completions.create(model=qwen.model, prompt=p, max_tokens=N,
                                    temperature=0).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(run, range(8), timeout=4 * TIMEOUT))
    for p, t in zip(prompts, texts):
        assert printed(t) == reference[p]


def test_stop_strings(qwen, reference):
    """The text ends right before the earliest stop string, streaming or not."""
    p = PROMPTS[0]
    full = reference[p].rstrip("\n")
    # A stop string from the middle of the text that spans a space, so most likely two tokens.
    i = full.index(" ", len(full) // 3)
    stop = full[i - 2:i + 3]
    expected = full[:full.index(stop)]
    c = client(qwen)
    r = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0, stop=stop)
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    s = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0,
                             stop=["never there", stop], stream=True)
    chunks = list(s)
    assert "".join(ch.choices[0].text for ch in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    # Of two stop strings, the one that comes first in the text wins.
    early = full[1:4]
    r = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0,
                             stop=[stop, early])
    assert r.choices[0].text == full[:full.index(early)]


def hf_render(template, messages, bos="", eos=""):
    """A chat template rendered as Hugging Face transformers renders it with Jinja2."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You answer in French."},
     {"role": "user", "content": "  Hello!\n"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "and \"3+3\"? {{ not a tag }} ünïcödé"}],
]


def print_chat_prompt(target, messages, *extra):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(messages, f)
        f.flush()
        out = subprocess.run([CLI, "serve", "--target", target, *extra, "--print-chat-prompt",
                              f.name], capture_output=True, text=True, timeout=TIMEOUT)
    if "no chat-template engine" in out.stderr:
        pytest.skip("this build has no chat-template engine (cargo was not found)")
    return out


@pytest.mark.release_only("MiniJinja's rendering against Jinja2's")
@pytest.mark.parametrize("model", ["qwen", "gemma"])
def test_chat_template_equals_jinja2(model):
    """MiniJinja's rendering of the model's template equals Jinja2's, character for character."""
    if model == "qwen":
        path = model_path(QWEN)
        template, extra, bos, eos = gguf_metadata(path, "tokenizer.chat_template"), [], "", ""
        tokens = gguf_metadata(path, "tokenizer.ggml.tokens")
        bos = tokens[gguf_metadata(path, "tokenizer.ggml.bos_token_id")]
        eos = tokens[gguf_metadata(path, "tokenizer.ggml.eos_token_id")]
    else:
        path = model_path(GEMMA)
        with open(GEMMA3_TEMPLATE) as f:
            template = f.read()
        extra, bos, eos = ["--chat-template", GEMMA3_TEMPLATE], "<bos>", "<eos>"
    assert template
    for messages in CONVERSATIONS:
        out = print_chat_prompt(f"gguf:path={path}", messages, *extra)
        assert out.returncode == 0, out.stderr
        assert out.stdout == hf_render(template, messages, bos, eos)
    if model == "gemma":  # the template's own raise_exception: roles must alternate
        bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        out = print_chat_prompt(f"gguf:path={path}", bad, *extra)
        assert out.returncode == 1
        assert "Conversation roles must alternate" in out.stderr


def test_chat_completion(qwen):
    """A chat request equals a completion of the prompt Jinja2 renders from the GGUF's template."""
    messages = CONVERSATIONS[0]
    print_chat_prompt(f"gguf:path={model_path(QWEN)}", messages)  # skips without the engine
    template = gguf_metadata(model_path(QWEN), "tokenizer.chat_template")
    prompt = hf_render(template, messages)
    c = client(qwen)
    chat = c.chat.completions.create(model=qwen.model, messages=messages, max_tokens=12,
                                     temperature=0)
    plain = c.completions.create(model=qwen.model, prompt=prompt, max_tokens=12, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.choices[0].finish_reason == plain.choices[0].finish_reason
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    stream = c.chat.completions.create(model=qwen.model, messages=messages, max_tokens=12,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


@pytest.mark.release_only(GENERATE_EQUALITY)
def test_sampling_is_seeded(qwen):
    c = client(qwen)
    kw = dict(model=qwen.model, prompt=PROMPTS[1], max_tokens=12, temperature=0.9, top_p=0.95)
    a = c.completions.create(seed=7, **kw).choices[0].text
    b = c.completions.create(seed=7, **kw).choices[0].text
    assert a == b
    # Sampled requests use the Gumbel-max coupler, so the text is the one plain sampling gives at
    # that seed, whatever the server's drafter drafted.
    plain = generate(qwen.target, "none", PROMPTS[1], 12, "--temp", "0.9", "--top-p", "0.95",
                     "--seed", "7", "--coupler", "gumbel")
    assert printed(a) == plain


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "temperature": 5}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "stop": 3}, "stop"),
    ({"prompt": "x", "stop": ["a", 1]}, "stop"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "n": 9}, "n"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 5}, "n"),  # more than the server's --parallel 4
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"prompt": ["x", ""]}, "prompt"),
    ({"prompt": ["x"] * 33}, "prompt"),
    ({"prompt": [["x"]]}, "prompt"),
    ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": ["x", [1], 3]}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [999999999]}, "prompt"),  # outside the vocabulary
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": "2"}, "logprobs"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -1}, "frequency_penalty"),
    ({"prompt": "x", "response_format": {"type": "xml"}}, "response_format"),
    ({"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format"),
    ({"prompt": "x", "response_format": "json"}, "response_format"),
    ({"prompt": "x", "grammar": ""}, "grammar"),
    ({"prompt": "x", "regex": ["a"]}, "regex"),
    ({"prompt": "x", "regex": "a", "grammar": "start: \"a\""}, "regex"),
    ({"prompt": "x", "regex": "a", "response_format": {"type": "json_object"}}, "regex"),
    ({"prompt": 42}, "prompt"),
    ({}, "prompt"),
])
def test_bad_parameters(qwen, body, param):
    status, j = post(qwen, "/v1/completions", body)
    assert status == 400
    assert set(j["error"]) == {"message", "type", "param", "code"}
    assert j["error"]["type"] == "invalid_request_error"
    assert j["error"]["param"] == param


def test_bad_requests(qwen):
    deep = '{"prompt": "x", "extra": ' + "[" * 100000 + "]" * 100000 + "}"
    for raw in ["{not json", "[1, 2]", "", deep, "\xff\xfe"]:
        status, j = post(qwen, "/v1/completions", raw)
        assert status == 400 and j["error"]["code"] == "invalid_json"
    for messages in [None, [], [{"content": "no role"}], [{"role": "user", "content": 3}]]:
        status, j = post(qwen, "/v1/chat/completions", {"messages": messages})
        assert status == 400 and j["error"]["param"] == "messages"
    status, j = post(qwen, "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and j["error"]["code"] == "model_not_found"
    status, j = post(qwen, "/v1/nothing", {})
    assert status == 404 and "error" in j
    with pytest.raises(openai.BadRequestError) as e:
        client(qwen).completions.create(model=qwen.model, prompt="x", max_tokens=-1)
    assert e.value.status_code == 400
    # A prompt longer than the context: 400 with both numbers.
    status, j = post(qwen, "/v1/completions", {"prompt": "word " * 600, "max_tokens": 4})
    assert status == 400 and j["error"]["code"] == "context_length_exceeded"
    assert re.search(r"\b6\d\d\b", j["error"]["message"]) and str(CTX) in j["error"]["message"]
    # The server still serves.
    r = client(qwen).completions.create(model=qwen.model, prompt=PROMPTS[0], max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_n_choices(qwen, reference):
    """n choices: the prompt scored once (by the first; the others take its scored positions),
    each choice what a request of its own gives: greedy ones the greedy text, sampled choice i the
    text of seed + i; streamed choices arrive by index and equal the whole answer's."""
    c = client(qwen)
    p = PROMPTS[1]
    one = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0)
    before = metric(qwen, "specinfer_prompt_tokens_total")
    r = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0, n=4)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert all(printed(ch.text) == reference[p] for ch in r.choices)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 4 * N
    assert metric(qwen, "specinfer_prompt_tokens_total") - before == one.usage.prompt_tokens
    kw = dict(model=qwen.model, prompt=p, max_tokens=12, temperature=0.9)
    r = c.completions.create(n=3, seed=40, **kw)
    for i, ch in enumerate(r.choices):
        assert ch.text == c.completions.create(seed=40 + i, **kw).choices[0].text
    assert len({ch.text for ch in r.choices}) > 1
    texts = ["", "", ""]
    finish = [None] * 3
    for chunk in c.completions.create(n=3, seed=40, stream=True, **kw):
        for ch in chunk.choices:
            texts[ch.index] += ch.text
            finish[ch.index] = finish[ch.index] or ch.finish_reason
    assert texts == [ch.text for ch in r.choices]
    assert finish == ["length"] * 3
    chat = c.chat.completions.create(model=qwen.model, max_tokens=8, temperature=0, n=2,
                                     messages=[{"role": "user", "content": "Say hi."}])
    assert len(chat.choices) == 2
    assert chat.choices[0].message.content == chat.choices[1].message.content


def test_echo_logprobs_equal_perplexity(qwen, tmp_path):
    """echo with logprobs gives the prompt's own log-probabilities: over the tokens `specinfer
    perplexity` scores in a chunk of 64 (the second half), their mean is its perplexity; every
    prompt token has an entry (the first with null), and the texts and offsets line up, streamed or
    not, with n=2."""
    text = open(os.path.join(os.path.dirname(__file__), "../../docs/SERVE.md"),
                encoding="utf-8").read()
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    out = subprocess.run([CLI, "perplexity", "--target", qwen.target, "-f", str(path), "-c", "64",
                          "--chunks", "1", "--threads", "2"], capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    ppl = float(re.search(r"PPL = ([0-9.]+)", out.stdout + out.stderr).group(1))
    status, j = post(qwen, "/tokenize", {"content": text})
    assert status == 200, j
    ids = j["tokens"][:64]
    c = client(qwen)
    r = c.completions.create(model=qwen.model, prompt=ids, max_tokens=2, temperature=0, echo=True,
                             logprobs=2, n=2)
    for choice in r.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == 64 + 2
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert "".join(lp.tokens) == choice.text
        assert lp.text_offset == [sum(len(t.encode()) for t in lp.tokens[:i])
                                  for i in range(len(lp.tokens))]
        for v, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
            assert v <= 0 and len(top) <= 2 and max(top.values()) >= v - 1e-6
        assert lp.token_logprobs[:64] == r.choices[0].logprobs.token_logprobs[:64]
    # llama-perplexity's scoring: the logits at positions 32 .. 62 for the tokens after them.
    scored = r.choices[0].logprobs.token_logprobs[33:64]
    mine = math.exp(-sum(scored) / len(scored))
    print(f"perplexity {ppl}, from the echoed logprobs {mine:.4f}")
    assert mine == pytest.approx(ppl, rel=1e-4)
    streamed = list(c.completions.create(model=qwen.model, prompt=ids, max_tokens=2,
                                         temperature=0, echo=True, logprobs=2, stream=True))
    tokens = [t for ch in streamed if ch.choices and ch.choices[0].logprobs
              for t in ch.choices[0].logprobs.tokens]
    values = [v for ch in streamed if ch.choices and ch.choices[0].logprobs
              for v in ch.choices[0].logprobs.token_logprobs]
    assert tokens == r.choices[0].logprobs.tokens
    assert values[0] is None
    assert values[1:] == pytest.approx(r.choices[0].logprobs.token_logprobs[1:], abs=1e-4)


def test_several_prompts(qwen, reference):
    """A completion with a list of prompts (texts or token-id lists) answers n choices for each,
    prompt i's at indexes i * n .. i * n + n - 1, each the text that prompt alone gives; usage
    counts every prompt once; echo puts each prompt before its own choices; one prompt that does
    not fit refuses the whole request."""
    c = client(qwen)
    ps = PROMPTS[:3]
    r = c.completions.create(model=qwen.model, prompt=ps, max_tokens=N, temperature=0, n=2)
    assert sorted(ch.index for ch in r.choices) == list(range(6))
    by_index = {ch.index: ch for ch in r.choices}
    for i, p in enumerate(ps):
        for j in range(2):
            assert printed(by_index[2 * i + j].text) == reference[p], (i, j)
    counts = [len(post(qwen, "/tokenize", {"content": p})[1]["tokens"]) for p in ps]
    assert r.usage.prompt_tokens == sum(counts)
    ids = [post(qwen, "/tokenize", {"content": p})[1]["tokens"] for p in ps[:2]]
    r = c.completions.create(model=qwen.model, prompt=ids, max_tokens=N, temperature=0, echo=True)
    assert [printed(ch.text) for ch in sorted(r.choices, key=lambda ch: ch.index)] == \
        [p + reference[p] for p in ps[:2]]
    texts = {}
    for chunk in c.completions.create(model=qwen.model, prompt=ps[:2], max_tokens=N, temperature=0,
                                      stream=True):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert [printed(texts[i]) for i in range(2)] == [reference[p] for p in ps[:2]]
    status, j = post(qwen, "/v1/completions", {"prompt": [ps[0], "x " * (2 * CTX)],
                                               "max_tokens": 4})
    assert status == 400 and j["error"]["code"] == "context_length_exceeded", j


def test_next_turn_finds_its_start_cached(qwen):
    """A request that continues an earlier one's text (a conversation's next turn) goes to the
    slot that served it and scores only the rest: usage's cached_tokens counts the positions found
    in the cache, the /metrics counter adds them up, and the text is the one a cold cache gives."""
    base = "\n".join(PROMPTS * 3) + "\n"
    c = client(qwen)
    first = c.completions.create(model=qwen.model, prompt=base, max_tokens=N, temperature=0)
    assert first.usage.prompt_tokens > 32
    before = metric(qwen, "specinfer_prompt_cached_tokens_total")
    turn = base + first.choices[0].text + "\n# next\n"
    r = c.completions.create(model=qwen.model, prompt=turn, max_tokens=N, temperature=0)
    cached = r.usage.prompt_tokens_details.cached_tokens
    # Everything the first request's session had cached, its prompt at least.
    assert first.usage.prompt_tokens <= cached < r.usage.prompt_tokens, (cached, r.usage)
    assert metric(qwen, "specinfer_prompt_cached_tokens_total") - before == cached
    if not SANITIZED:  # exactness: GENERATE_EQUALITY
        assert printed(r.choices[0].text) == generate(qwen.target, "ngram", turn, N)
    # A prompt that shares nothing with any slot's text finds nothing cached.
    r = c.completions.create(model=qwen.model, prompt="SELECT name FROM", max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_token_prompts_tokenize_and_echo(qwen, reference):
    """A prompt of token ids (from /tokenize) gives the text the prompt's text gives; /detokenize
    turns them back; echo puts the prompt before the completion."""
    p = PROMPTS[0]
    status, j = post(qwen, "/tokenize", {"content": p})
    assert status == 200, j
    ids = j["tokens"]
    assert ids and all(isinstance(t, int) for t in ids)
    assert post(qwen, "/detokenize", {"tokens": ids}) == (200, {"content": p})
    c = client(qwen)
    for prompt in (ids, [ids]):
        r = c.completions.create(model=qwen.model, prompt=prompt, max_tokens=N, temperature=0)
        assert printed(r.choices[0].text) == reference[p]
        assert r.usage.prompt_tokens == len(ids)
    r = c.completions.create(model=qwen.model, prompt=p, max_tokens=N, temperature=0, echo=True)
    assert printed(r.choices[0].text) == p + reference[p]
    r = c.completions.create(model=qwen.model, prompt=ids, max_tokens=N, temperature=0,
                             echo=True, n=2)
    assert [printed(ch.text) for ch in r.choices] == [p + reference[p]] * 2
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=qwen.model, prompt=p, max_tokens=N, temperature=0, echo=True, stream=True))
    assert printed(streamed) == p + reference[p]
    for path, body, param in [("/tokenize", {"content": 3}, "content"),
                              ("/tokenize", {"content": "x", "add_special": "no"}, "add_special"),
                              ("/detokenize", {"tokens": "1 2"}, "tokens"),
                              ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
                              ("/tokenize", {"content": "x", "model": "other"}, "model")]:
        status, j = post(qwen, path, body)
        assert status in (400, 404) and j["error"]["param"] == param, (path, body, j)


# Structured output: a schema whose JSON has no free whitespace (most tokens are forced).
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 18, "maximum": 99},
                         "languages": {"type": "array", "minItems": 1, "maxItems": 3,
                                       "items": {"enum": ["python", "rust", "go"]}}},
          "required": ["name", "age", "languages"], "additionalProperties": False,
          "x-guidance": {"whitespace_flexible": False}}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
JSON_ASK = "Describe a programmer as JSON."
JSON_PROMPT = f"<|im_start|>user\n{JSON_ASK}<|im_end|>\n<|im_start|>assistant\n"


def constraint_or_skip(server):
    """Skips when the server has no llguidance plugin (built only with a new enough cargo)."""
    status, j = post(server, "/v1/completions",
                     {"prompt": "x", "max_tokens": 1, "regex": "[a-z]"})
    if status == 400 and "llguidance" in j["error"]["message"]:
        pytest.skip("the llguidance plugin is not built: " + j["error"]["message"])
    assert status == 200, j


def test_response_format_json_schema(qwen, tmp_path):
    """A json_schema response_format gives what `specinfer generate --json-schema` prints, JSON
    that validates; four such requests at once (one shared pass per step, forced tokens drafted
    in it) give the same text; chat, streamed or not, validates too."""
    constraint_or_skip(qwen)
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(PERSON))
    want = generate(qwen.target, "ngram", JSON_PROMPT, 64, "--json-schema", str(schema_file))
    c = client(qwen)
    kw = dict(model=qwen.model, prompt=JSON_PROMPT, max_tokens=64, temperature=0,
              extra_body={"response_format": PERSON_FORMAT})
    r = c.completions.create(**kw)
    text = r.choices[0].text
    assert printed(text) == want
    jsonschema.validate(json.loads(text), PERSON)
    assert r.choices[0].finish_reason == "stop"
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        texts = list(ex.map(lambda _: c.completions.create(**kw).choices[0].text, range(4)))
    assert texts == [text] * 4
    messages = [{"role": "user", "content": JSON_ASK}]
    chat = c.chat.completions.create(model=qwen.model, messages=messages, max_tokens=64,
                                     temperature=0, response_format=PERSON_FORMAT)
    jsonschema.validate(json.loads(chat.choices[0].message.content), PERSON)
    stream = c.chat.completions.create(model=qwen.model, messages=messages, max_tokens=64,
                                       temperature=0, response_format=PERSON_FORMAT, stream=True)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert streamed == chat.choices[0].message.content
    # Sampled: still valid, and the seed's text.
    kw.update(temperature=0.9, seed=11)
    a, b = (c.completions.create(**kw).choices[0].text for _ in range(2))
    assert a == b
    jsonschema.validate(json.loads(a), PERSON)


def test_json_object_regex_and_grammar(qwen):
    constraint_or_skip(qwen)
    c = client(qwen)
    ask = 'Answer with a JSON object whose one key "answer" holds the sum of 2 and 2.'
    r = c.chat.completions.create(model=qwen.model, max_tokens=64, temperature=0,
                                  messages=[{"role": "user", "content": ask}],
                                  response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r = c.completions.create(model=qwen.model, prompt="The date today, as YYYY-MM-DD:",
                             max_tokens=16, temperature=0, extra_body={"regex": date})
    assert re.fullmatch(date, r.choices[0].text), r.choices[0].text
    lark = 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no" | "maybe"\n'
    r = c.completions.create(model=qwen.model, prompt="Is water wet?", max_tokens=16,
                             temperature=0, extra_body={"grammar": lark})
    assert r.choices[0].text in {f"The answer is {a}." for a in ["yes", "no", "maybe"]}
    assert r.choices[0].finish_reason == "stop"


def test_constraints_that_do_not_compile(qwen):
    """400 naming the field, with the compiler's reason; the server goes on serving."""
    constraint_or_skip(qwen)
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x",
                                                         "schema": {"type": "frobnicate"}}}
    for field, value in [("response_format", bad_schema), ("grammar", "start: undefined_rule"),
                         ("regex", "(ab")]:
        status, j = post(qwen, "/v1/completions", {"prompt": "x", "max_tokens": 4, field: value})
        assert status == 400, j
        assert j["error"]["param"] == field
        assert "compile" in j["error"]["message"], j
    r = client(qwen).completions.create(model=qwen.model, prompt=PROMPTS[0], max_tokens=2)
    assert r.usage.completion_tokens == 2


# bench/json-extract's tasks: ten schemas (nested objects, bounded arrays, enums, bounded numbers,
# optional keys, patterns, no additional properties), two texts to extract from for each.
EXTRACTION_TASKS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "prompts",
                                "json-extraction.jsonl")


@pytest.mark.release_only("fifty generations for a count of valid answers (3.5 min under ASan); "
                          "the other constraint tests run there")
def test_fifty_schema_requests(qwen):
    """Fifty chat requests with a json_schema response_format, four at once (their grammars
    compiled and stepped side by side), five for each of the ten schemas, greedy or sampled with
    a seed of their own: every answer ends by itself ("stop") with JSON that its schema accepts,
    and the greedy answers to one text are one answer."""
    constraint_or_skip(qwen)
    with open(EXTRACTION_TASKS, encoding="utf-8") as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    by_schema = {}
    for task in tasks:
        by_schema.setdefault(task["schema_name"], []).append(task)
    schemas = list(by_schema.values())
    assert len(schemas) == 10
    c = client(qwen)

    def ask(i):
        # Request i: schema i % 10, its texts in turn; greedy and sampled alternate per schema.
        task = schemas[i % 10][(i // 10) % len(schemas[i % 10])]
        greedy = (i + i // 10) % 2 == 0
        sampling = dict(temperature=0) if greedy else dict(temperature=0.8, seed=1000 + i)
        fmt = {"type": "json_schema",
               "json_schema": {"name": task["schema_name"], "schema": task["schema"]}}
        r = c.chat.completions.create(
            model=qwen.model, max_tokens=160, response_format=fmt,
            messages=[{"role": "user",
                       "content": "Extract the following as JSON.\n\n" + task["text"]}],
            **sampling)
        return task, greedy, r.choices[0]

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        answers = list(ex.map(ask, range(50)))
    assert sum(greedy for _, greedy, _ in answers) == 25
    greedy_texts = {}
    for task, greedy, choice in answers:
        text = choice.message.content
        assert choice.finish_reason == "stop", (task["id"], text)
        jsonschema.validate(json.loads(text), task["schema"])
        if greedy:
            assert greedy_texts.setdefault(task["id"], text) == text, task["id"]


def test_logprobs(qwen):
    """Completions' `logprobs` and chat's `logprobs`/`top_logprobs`: one entry per token, the greedy
    token the most likely of its alternatives, the same numbers streamed, alone and four at once
    (the library's test_spec_real_models checks them against the model fed as plain decoding)."""
    c = client(qwen)
    kw = dict(model=qwen.model, prompt=PROMPTS[0], max_tokens=N, temperature=0, logprobs=3)
    r = c.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == N
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t.encode()) for t in lp.tokens[:i]) for i in range(N)]
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert v <= 0 and len(top) == 3
        assert max(top.values()) == pytest.approx(v, abs=1e-6) and top[tok] == pytest.approx(v)
    stream = c.completions.create(stream=True, **kw)
    streamed = [(t, v) for ch in stream if ch.choices and ch.choices[0].logprobs
                for t, v in zip(ch.choices[0].logprobs.tokens, ch.choices[0].logprobs.token_logprobs)]
    assert [t for t, _ in streamed] == lp.tokens
    assert [v for _, v in streamed] == pytest.approx(lp.token_logprobs, abs=1e-4)
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        batched = list(ex.map(lambda p: c.completions.create(**dict(kw, prompt=p)),
                              [PROMPTS[0]] + PROMPTS))
    for b in batched[:2]:
        assert b.choices[0].logprobs.tokens == lp.tokens
        assert b.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs, abs=1e-4)
    messages = [{"role": "user", "content": "Say hello."}]
    chat = c.chat.completions.create(model=qwen.model, messages=messages, max_tokens=8,
                                     temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    for t in content:
        assert bytes(t.bytes) == t.token.encode() and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].token == t.token
    plain = c.chat.completions.create(model=qwen.model, messages=messages, max_tokens=8,
                                      temperature=0)
    assert plain.choices[0].logprobs is None
    for body, param in [({"messages": messages, "top_logprobs": 2}, "top_logprobs"),
                        ({"messages": messages, "logprobs": 3}, "logprobs"),
                        ({"messages": messages, "logprobs": True, "top_logprobs": 21},
                         "top_logprobs")]:
        status, j = post(qwen, "/v1/chat/completions", body)
        assert status == 400 and j["error"]["param"] == param, j


WEATHER = {"type": "function",
           "function": {"name": "get_weather", "description": "The weather in a city now",
                        "parameters": {"type": "object",
                                       "properties": {"city": {"type": "string"},
                                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                                       "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def test_tool_calls(qwen):
    """tool_choice "required" gives parsed calls whose arguments fit the function's schema; the
    same named and streamed; the call and its result go back for a text answer; bad tools get
    400 naming the field."""
    constraint_or_skip(qwen)
    c = client(qwen)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=qwen.model, max_tokens=64, temperature=0, tools=[WEATHER, TIME])
    r = c.chat.completions.create(messages=messages, tool_choice="required", **kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id
    if call.function.name == "get_weather":
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, WEATHER["function"]["parameters"])
    named = dict(kw, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = c.chat.completions.create(messages=messages, **named)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    stream = c.chat.completions.create(messages=messages, stream=True, **named)
    chunks = [ch for ch in stream if ch.choices]
    streamed = [tc for ch in chunks if ch.choices[0].delta.tool_calls
                for tc in ch.choices[0].delta.tool_calls]
    assert streamed[0].function.name == "get_weather"
    assert json.loads(streamed[0].function.arguments) == args
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The conversation goes on: the call and its result in, text out.
    messages += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": call.id, "type": "function",
                                  "function": {"name": "get_weather",
                                               "arguments": call.function.arguments}}]},
                 {"role": "tool", "tool_call_id": call.id,
                  "content": json.dumps({"temperature": 18, "unit": "celsius"})}]
    r = c.chat.completions.create(messages=messages, tool_choice="none", **kw)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")
    for body, param in [
            ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
            ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                  "function": {"name": "other"}}},
             "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
            ({"tools": [WEATHER], "tool_choice": "required",
              "response_format": {"type": "json_object"}}, "tool_choice")]:
        status, j = post(qwen, "/v1/chat/completions", dict(body, messages=messages[:1]))
        assert status == 400 and j["error"]["param"] == param, (body, j)
    status, j = post(qwen, "/v1/completions", {"prompt": "x", "tools": [WEATHER]})
    assert status == 400 and j["error"]["param"] == "tools"


def test_tools_need_a_tool_call_template(gemma):
    status, j = post(gemma, "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]})
    assert status == 400 and j["error"]["param"] == "tools"
    assert "tool-call format" in j["error"]["message"]


@pytest.mark.release_only("a latency ratio")
def test_idle_connections_do_not_stall(qwen):
    """1,000 connections, half of them sending nothing (idle or half-open clients) and half a part
    of a request's head and then nothing (slow clients), do not hold up a normal
    request: it is answered within 1.5x its time on the idle server (best of three each). The
    connections open at once, not in handshake retries (the listen backlog is wide)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the file limit ({hard}) is below 1,200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                else 4096, hard))
    body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}

    def timed():
        t0 = time.monotonic()
        status, j = post(qwen, "/v1/completions", body)
        assert status == 200, j
        return time.monotonic() - t0

    timed()
    idle = min(timed() for _ in range(3))
    socks = []
    try:
        t0 = time.monotonic()
        for i in range(1000):
            sock = socket.create_connection(("127.0.0.1", qwen.port), timeout=TIMEOUT)
            socks.append(sock)
            if i % 2:  # a slow client: half its request's head sent, the rest never
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        opened = time.monotonic() - t0
        time.sleep(0.5)  # the server has taken the slow clients' connections
        busy = min(timed() for _ in range(3))
    finally:
        for sock in socks:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(f"1,000 idle and slow connections opened in {opened:.2f} s; a request with them open: "
          f"{busy:.3f} s; alone {idle:.3f} s")
    assert opened < 5, "handshakes retried: the listen backlog is narrow"
    assert busy <= 1.5 * idle + 0.02


def test_context_full_ends_with_length(qwen):
    """A completion that reaches the end of the context ends there, with finish_reason length."""
    # About 370 tokens for a 512-token context, 180 for 256: the rest is generated.
    prompt = "x = [" + ", ".join(str(i) for i in range(95 * CTX // 512)) + ","
    r = client(qwen).completions.create(model=qwen.model, prompt=prompt, max_tokens=400,
                                        temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == CTX


def test_metrics(qwen):
    client(qwen).completions.create(model=qwen.model, prompt=PROMPTS[2], max_tokens=4)
    assert metric(qwen, "specinfer_generated_tokens_total") >= 4
    assert metric(qwen, "specinfer_prompt_tokens_total") > 0
    assert metric(qwen, "specinfer_queue_depth") == 0
    assert metric(qwen, "specinfer_round_seconds_count") > 0
    assert 0 <= metric(qwen, "specinfer_acceptance_rate") <= 1
    # The batched steps: every round of every request went through one, and the budget rule's
    # choices and the passes' times are there to compare.
    steps = metric(qwen, "specinfer_steps_total")
    rounds = metric(qwen, "specinfer_step_rounds_total")
    assert 0 < steps <= rounds
    assert rounds == metric(qwen, "specinfer_round_seconds_count")
    assert metric(qwen, "specinfer_step_tokens_total") == metric(qwen, "specinfer_generated_tokens_total")
    assert 0 <= metric(qwen, "specinfer_step_drafted_tokens_total") <= \
        metric(qwen, "specinfer_step_draft_budget_tokens_total")
    assert metric(qwen, "specinfer_step_drafted_tokens_total") == \
        metric(qwen, "specinfer_drafted_tokens_total")
    assert 0 < metric(qwen, "specinfer_step_pass_seconds_total") <= \
        metric(qwen, "specinfer_step_seconds_total")
    assert metric(qwen, "specinfer_step_predicted_pass_seconds_total") > 0
    assert metric(qwen, "specinfer_goodput_tokens_per_second") > 0
    chosen = metric(qwen, 'specinfer_planned_goodput_tokens_per_second{plan="chosen"}')
    assert chosen >= metric(qwen, 'specinfer_planned_goodput_tokens_per_second{plan="plain"}')
    _, text = get(qwen, "/metrics")
    assert 'specinfer_http_requests_total{path="/v1/completions",status="200"}' in text


@pytest.fixture(scope="module")
def gemma():
    """A server that runs one request at a time and holds one more waiting."""
    # --model NAME with --target: the target served under that name.
    server = Server(["--target", f"gguf:path={model_path(GEMMA)},n_ctx=1024", "--threads", "2",
                     "--queue", "1", "--parallel", "1", "--chat-template", GEMMA3_TEMPLATE,
                     "--model", "gemma-small"])
    server.model = "gemma-small"
    yield server
    assert server.stop() == 0


def wait_for(condition):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    pytest.fail("timed out waiting")


def test_full_queue_and_cancelled_stream(gemma):
    """One request runs, one waits, the next gets 429; the running one's client goes away, so it
    is cancelled and the waiting one runs."""
    c = client(gemma)
    long = c.completions.create(model=gemma.model, prompt="Once upon a time", max_tokens=800,
                                temperature=0, stream=True)
    it = iter(long)
    next(it)  # it runs
    result = {}
    waiting = threading.Thread(target=lambda: result.update(r=c.completions.create(
        model=gemma.model, prompt="The sea is", max_tokens=3)))
    waiting.start()
    wait_for(lambda: metric(gemma, "specinfer_queue_depth") == 1)
    status, j = post(gemma, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 429
    assert j["error"]["type"] == "rate_limit_error"
    with pytest.raises(openai.RateLimitError):
        c.completions.create(model=gemma.model, prompt="x", max_tokens=1)
    long.close()  # the client goes away
    waiting.join(TIMEOUT)
    assert not waiting.is_alive()
    assert result["r"].usage.completion_tokens <= 3
    wait_for(lambda: metric(gemma, 'specinfer_requests_total{outcome="cancelled"}') == 1)
    assert metric(gemma, 'specinfer_requests_total{outcome="rejected"}') == 2
    # And the next request is served at once.
    r = c.completions.create(model=gemma.model, prompt="The sea is", max_tokens=4)
    assert 1 <= r.usage.completion_tokens <= 4


def test_non_streaming_client_gone_is_cancelled(gemma):
    """A non-streaming request whose client disconnects is cancelled, not run to max_tokens."""
    before = metric(gemma, 'specinfer_requests_total{outcome="cancelled"}')
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0})
    with socket.create_connection(("127.0.0.1", gemma.port), timeout=TIMEOUT) as s:
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        wait_for(lambda: metric(gemma, "specinfer_requests_running") == 1)
    wait_for(lambda: metric(gemma, 'specinfer_requests_total{outcome="cancelled"}') == before + 1)
    r = client(gemma).completions.create(model=gemma.model, prompt="The sea is", max_tokens=2)
    assert 1 <= r.usage.completion_tokens <= 2


def test_command_line():
    """Usage errors exit 2 naming the option; a target that cannot open exits 1 saying why."""
    def run(*args):
        return subprocess.run([CLI, "serve", *args], capture_output=True, text=True,
                              timeout=TIMEOUT)

    out = run("--help")
    assert out.returncode == 0
    for option in ["--target", "--drafter", "--host", "--port", "--queue", "--parallel",
                   "--prefill-chunk", "--model", "--chat-template", "--threads", "--max-tokens"]:
        assert option in out.stdout
    assert "--model NAME=PATH" in out.stdout and "--drafter [NAME=]" in out.stdout
    out = run("--port", "1")
    assert out.returncode == 2 and "--target" in out.stderr
    out = run("--target", "kgram:path=/nonexistent", "--port", "70000")
    assert out.returncode == 2 and "--port" in out.stderr
    out = run("--target", "gguf:path=/nonexistent.gguf", "--port", "0")
    assert out.returncode == 1 and "/nonexistent.gguf" in out.stderr


@pytest.mark.release_only("which drafter a model gets: a choice made once at start-up")
def test_default_drafter(tmp_path):
    """With no --drafter a model gets prompt lookup, or Medusa heads with lookup when a heads file
    for it lies beside it (MODEL.medusa.gguf); --drafter none turns drafting off."""
    model = tmp_path / "m.gguf"
    model.symlink_to(model_path(GEMMA))
    for drafter, said in [([], ", drafter ngram\n"), (["--drafter", "none"], None)]:
        server = Server(["--target", f"gguf:path={model}", "--threads", "2", "-n", "4", *drafter])
        try:
            named = [line for line in server.log if ", drafter " in line]
            if said is None:
                assert named == [], server.log
            else:
                assert len(named) == 1 and named[0].endswith(said), server.log
            r = client(server).completions.create(model="m", prompt="The sea is", max_tokens=2)
            assert 1 <= r.usage.completion_tokens <= 2
        finally:
            assert server.stop() == 0
    # The heads file is the one beside the model: one for another model is refused, named.
    (tmp_path / "m.medusa.gguf").write_bytes(b"GGUF")
    out = subprocess.run([CLI, "serve", "--target", f"gguf:path={model}", "--port", "0"],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 1 and "m.medusa.gguf" in out.stderr, out.stderr


def test_port_in_use(gemma):
    out = subprocess.run([CLI, "serve", "--target", f"gguf:path={model_path(GEMMA)}",
                          "--host", "127.0.0.1", "--port", str(gemma.port)],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 1 and "cannot listen" in out.stderr


def test_any_field_of_any_type(qwen):
    """Every field given every JSON type: an answer or a 4xx error object, never a crash."""
    values = [None, True, False, 0, 1, -1, 2.5, "", "s", [], {}, [1], ["a"], {"a": 1}]
    fields = ["prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
              "stream_options", "n", "model", "echo", "logprobs", "response_format", "grammar",
              "regex", "logit_bias", "presence_penalty", "top_logprobs", "tools",
              "tool_choice"]
    requests = []
    for path, base in [("/v1/completions", {"prompt": "x", "max_tokens": 1}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})]:
        for field in fields + (["messages"] if "chat" in path else []):
            for v in values:
                body = dict(base, **{field: v})
                if body.get("stream") is not True:  # an SSE answer, not JSON: tested above
                    requests.append((path, body))

    def check(request):
        path, body = request
        status, j = post(qwen, path, body)
        assert status in (200, 400, 404), (body, status, j)
        assert ("error" in j) == (status != 200), (body, j)

    # Four at a time, as many as the server runs: bad bodies beside running requests.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(check, requests))
    for role in ["tool", "function", "alien", ""]:
        status, j = post(qwen, "/v1/chat/completions",
                         {"messages": [{"role": role, "content": "x"}], "max_tokens": 1})
        assert status in (200, 400), (role, status, j)
    assert json.loads(get(qwen, "/health")[1]) == {"status": "ok"}


# Several models by name: Qwen2.5-Coder 0.5B given as a target spec, Gemma 3 270M as a bare path.
PAIR_PROMPTS = ["def fibonacci(n):", "The capital of France is"]


@pytest.fixture(scope="module")
def pair():
    coder = f"gguf:path={model_path(QWEN)},n_ctx=512"
    gemma = model_path(GEMMA)
    # ngram drafts for every model but gemma (a per-model drafter replaces the one for all), with
    # a fixed draft length, so that coder's drafts do not depend on what the budget rule of two
    # requests stepped together finds worth drafting; the chat template of gemma comes from a
    # file, coder's from its GGUF.
    server = Server(["--model", f"coder={coder}", "--model", f"gemma={gemma}",
                     "--fixed-draft", "--max-draft", "4",
                     "--drafter", "ngram", "--drafter", "gemma=none",
                     "--chat-template", f"gemma={GEMMA3_TEMPLATE}",
                     "--threads", "2", "-n", "16", "--parallel", "2"])
    server.model = None
    server.targets = {"coder": coder, "gemma": f"gguf:path={gemma}"}
    yield server
    assert server.stop() == 0


def test_pair_lists_both_models(pair):
    c = client(pair)
    assert [m.id for m in c.models.list().data] == ["coder", "gemma"]
    assert c.models.retrieve("gemma").id == "gemma"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gemma-3-270m")
    # Each model's drafter as asked: ngram for coder, none for gemma.
    log = "".join(pair.log)
    assert re.search(r"model coder: \S+, drafter ngram\n", log), log
    assert re.search(r"model gemma: \S+\n", log), log


@pytest.mark.release_only(GENERATE_EQUALITY)
def test_pair_each_model_equals_generate(pair):
    """Both models at once, from several clients: each answers as `specinfer generate` on it."""
    reference = {(name, p): generate(target, "none", p, N)
                 for name, target in pair.targets.items() for p in PAIR_PROMPTS}
    assert reference[("coder", PAIR_PROMPTS[0])] != reference[("gemma", PAIR_PROMPTS[0])]
    c = client(pair)
    jobs = list(reference) * 2

    def run(i):
        name, p = jobs[i]
        if i % 2:
            s = c.completions.create(model=name, prompt=p, max_tokens=N, temperature=0,
                                     stream=True)
            chunks = list(s)
            assert all(ch.model == name for ch in chunks)
            return "".join(ch.choices[0].text for ch in chunks)
        r = c.completions.create(model=name, prompt=p, max_tokens=N, temperature=0)
        assert r.model == name
        return r.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(run, range(len(jobs)), timeout=4 * TIMEOUT))
    for job, text in zip(jobs, texts):
        assert printed(text) == reference[job], job
    # The metrics count each model's own requests; only coder drafts.
    for name in pair.targets:
        assert metric(pair, 'specinfer_requests_total{outcome="done"}', name) >= len(PAIR_PROMPTS) * 2
        assert metric(pair, "specinfer_generated_tokens_total", name) >= 2 * len(PAIR_PROMPTS) * N
    assert metric(pair, "specinfer_drafted_tokens_total", "coder") > 0
    assert metric(pair, "specinfer_drafted_tokens_total", "gemma") == 0


def test_pair_unknown_or_missing_model(pair):
    status, j = post(pair, "/v1/completions", {"model": "qwen2.5-coder-0.5b", "prompt": "x"})
    assert status == 404
    assert j["error"]["code"] == "model_not_found" and j["error"]["param"] == "model"
    assert "'coder'" in j["error"]["message"] and "'gemma'" in j["error"]["message"]
    status, j = post(pair, "/v1/chat/completions",
                     {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and j["error"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client(pair).completions.create(model="nope", prompt="x", max_tokens=1)
    # With two models, a request must say which.
    status, j = post(pair, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 400 and j["error"]["param"] == "model"
    status, j = post(pair, "/v1/completions", {"model": 3, "prompt": "x", "max_tokens": 1})
    assert status == 400 and j["error"]["param"] == "model"
    _, text = get(pair, "/metrics")
    assert 'specinfer_http_requests_total{path="/v1/completions",status="404"}' in text


@pytest.mark.release_only("each model's template rendering against Jinja2's")
def test_pair_chat_templates_per_model(pair):
    """Each model's chat prompt comes from its own template: coder's GGUF, gemma's file."""
    messages = CONVERSATIONS[1]
    print_chat_prompt(f"gguf:path={model_path(QWEN)}", messages)  # skips without the engine
    with open(GEMMA3_TEMPLATE) as f:
        gemma_template = f.read()
    # Gemma's tokenizer adds bos itself, so the prompt is the rendering without it.
    prompts = {"coder": hf_render(gguf_metadata(model_path(QWEN), "tokenizer.chat_template"),
                                  messages),
               "gemma": hf_render(gemma_template, messages, "", "<eos>")}
    assert prompts["coder"] != prompts["gemma"]
    c = client(pair)
    for name, prompt in prompts.items():
        chat = c.chat.completions.create(model=name, messages=messages, max_tokens=8,
                                         temperature=0)
        plain = c.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)
        assert chat.model == name
        assert chat.choices[0].message.content == plain.choices[0].text, name
        assert chat.usage.prompt_tokens == plain.usage.prompt_tokens, name


def test_model_options_refused():
    """Bad --model, --drafter and --chat-template values exit 2 naming the problem."""
    def run(*args):
        return subprocess.run([CLI, "serve", "--port", "0", *args], capture_output=True,
                              text=True, timeout=TIMEOUT)

    for args, words in [
        (["--model", "a=x.gguf", "--model", "a=y.gguf"], "'a' is given to two models"),
        (["--model", "bare"], "--model bare"),
        (["--model", "a="], "no path"),
        (["--model", "my model=x.gguf"], "not a valid model name"),
        (["--model", "a=x.gguf", "--drafter", "b=ngram"], "no served model is named 'b'"),
        (["--model", "a=x.gguf", "--drafter", "a=ngram", "--drafter", "c=none"], "'c'"),
    ]:
        out = run(*args)
        assert out.returncode == 2 and words in out.stderr, (args, out.stderr)
    out = run("--model", "a=/nonexistent.gguf")
    assert out.returncode == 1 and "/nonexistent.gguf" in out.stderr
    # A key given twice reaches the plugin as given, which refuses it.
    out = run("--model", "a=gguf:path=/nonexistent.gguf,n_ctx=64,n_ctx=128")
    assert out.returncode == 1 and "'n_ctx' given twice" in out.stderr, out.stderr
    gemma = model_path(GEMMA)  # a drafter repeating a key, its last path a served model's
    out = run("--model", f"a={gemma}", "--drafter", f"a=draft-model:path=/other.gguf,path={gemma}")
    assert out.returncode == 1 and "'path' given twice" in out.stderr, out.stderr


QWEN15 = "qwen2.5-coder-1.5b.gguf"


def resident_bytes(server):
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    pytest.fail("no VmRSS")


@pytest.mark.release_only("resident memory, which the sanitizers' shadow memory swamps")
def test_served_draft_model_is_loaded_once():
    """Qwen2.5-Coder 1.5B drafted by the 0.5B, which is served as well: the draft model is the
    served one, so the drafter adds no second copy of the 0.5B's weights to the server's resident
    memory, while a draft model configured otherwise (another n_ctx) does."""
    big, small = model_path(QWEN15), model_path(QWEN)
    small_bytes = os.path.getsize(small)
    base = ["--model", f"coder={big}", "--model", f"small=gguf:path={small},n_ctx=512",
            "--threads", "2", "--parallel", "1", "-n", "8"]
    prompt = PROMPTS[0]

    def measure(*drafter):
        server = Server(base + list(drafter))
        try:
            texts = {}
            for name in ["coder", "small"]:  # every model's weights and caches in use
                texts[name] = client(server).completions.create(
                    model=name, prompt=prompt, max_tokens=N, temperature=0).choices[0].text
            drafted = metric(server, "specinfer_drafted_tokens_total", "coder")
            return resident_bytes(server), texts, drafted, "".join(server.log)
        finally:
            assert server.stop() == 0

    alone, texts, drafted, _ = measure("--drafter", "none")
    assert drafted == 0
    shared, shared_texts, drafted, log = measure("--drafter",
                                                 f"coder=draft-model:path={small}")
    assert "model coder: its draft model is served model small" in log, log
    assert drafted > 0
    assert shared_texts == texts
    assert printed(texts["coder"]) == generate(f"gguf:path={big}", "none", prompt, N)
    apart, apart_texts, drafted, log = measure(
        "--drafter", f"coder=draft-model:path={small},n_ctx=256,requant=none,vocab_limit=0")
    assert "its draft model is loaded on its own" in log and "n_ctx=256" in log, log
    assert drafted > 0 and apart_texts == texts
    mib = 1 << 20
    print(f"resident: {alone // mib} MiB without a drafter, {shared // mib} MiB with the served "
          f"0.5B drafting, {apart // mib} MiB with a copy of its own (file {small_bytes // mib} "
          "MiB)")
    assert shared - alone < small_bytes // 4
    assert apart - alone > small_bytes // 2
