"""A real model (Qwen2.5-Coder 0.5B, from scripts/fetch-models) with a Python drafter. Skipped,
saying so, when the file is absent ($SPECINFER_MODELS, default ~/.cache/specinfer/models)."""
import os
import pathlib

import pytest

import specinfer

from conftest import Probe, check_seen, corpus

MODELS = pathlib.Path(os.environ.get("SPECINFER_MODELS", pathlib.Path.home() / ".cache/specinfer/models"))
MODEL = MODELS / "qwen2.5-coder-0.5b.gguf"
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} not found (scripts/fetch-models)")
def test_python_drafter_on_a_real_model_gives_the_plain_greedy_text():
    reg = specinfer.Registry(2)
    probes = []
    reg.register_drafter("lookup-py", lambda cfg, info: probes.append(Probe(n_max=2)) or probes[-1])
    target = reg.open_target("gguf", f"path={MODEL}")
    info = target.info()
    assert info.arch == "qwen2" and info.vocab_size > 100000
    assert "<|im_start|>" in info.chat_template  # Qwen2.5's GGUF carries its chat template

    def run(drafter):
        with specinfer.Session(target, drafter, max_draft=4) as s:
            s.feed_text(PROMPT)
            return "".join(s.stream(40)), s.stats()

    plain, st0 = run(None)
    drafter = reg.open_drafter("lookup-py", "", target)
    spec, st = run(drafter)
    assert spec == plain and plain.strip()
    assert st.n_generated == st0.n_generated
    assert st.n_drafted > 0
    # The drafter gets the target's hidden state of the position that chose the last token.
    check_seen(probes[0].seen, info.hidden_size, True)


@pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} not found (scripts/fetch-models)")
def test_medusa_training_on_a_real_model_stops_when_progress_says_so(tmp_path):
    reg = specinfer.Registry(2)
    target = reg.open_target("gguf", f"path={MODEL}")
    seen = []
    with pytest.raises(specinfer.SpecinferError) as e:
        reg.train_drafter("medusa", target, tmp_path / "heads.gguf", [corpus()],
                          progress=lambda p: seen.append(p) or False)
    assert e.value.code == specinfer.Code.CANCELLED, e.value
    assert len(seen) == 1 and seen[0].stage == "collect" and seen[0].total > 0, seen
    assert not (tmp_path / "heads.gguf").exists()


@pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} not found (scripts/fetch-models)")
def test_constraint_and_logprobs_on_a_real_model():
    """A regex constraint makes the text match it, with a drafter too; each emitted token's
    log-probability comes with its alternatives, the greedy token the most likely one."""
    import math
    import re
    reg = specinfer.Registry(2)
    target = reg.open_target("gguf", f"path={MODEL}")
    try:
        c = specinfer.Constraint(reg, target, "regex", "[0-9]{4}-[0-9]{2}-[0-9]{2}")
    except specinfer.SpecinferError as e:
        assert e.code == specinfer.Code.NOT_FOUND
        pytest.skip(f"no llguidance plugin: {e}")
    with pytest.raises(specinfer.SpecinferError) as e:
        specinfer.Constraint(reg, target, "regex", "(unclosed")
    assert e.value.code == specinfer.Code.INVALID_ARGUMENT and "does not compile" in str(e.value)
    prompt = "<|im_start|>user\nWhat is the date?<|im_end|>\n<|im_start|>assistant\n"
    texts = []
    for drafter in (None, reg.open_drafter("ngram", "", target)):
        with specinfer.Session(target, drafter) as s:
            s.set_constraint(c if drafter is None else c.fork())
            s.set_logprobs(3)
            s.feed_text(prompt)
            text, logprobs = "", []
            while True:
                toks, done = s.step()
                text += s.step_text()
                lp = s.step_logprobs()
                assert [t.token for t in lp] == toks
                logprobs += lp
                if done:
                    break
            texts.append(text)
            for t in logprobs:
                assert t.logprob <= 0 and len(t.top) == 3 and math.isfinite(t.logprob)
                assert t.top[0][1] >= t.top[1][1] >= t.top[2][1]
    assert texts[0] == texts[1] and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", texts[0]), texts


def test_prompt_logprobs_on_a_real_model():
    """set_prompt_logprobs: after the first step, every prompt token from the second on has its
    log-probability, and the first generated token's greedy choice is the most likely one after
    the whole prompt (the same row the step's own logprobs read)."""
    reg = specinfer.Registry(2)
    target = reg.open_target("gguf", f"path={MODEL}")
    prompt = "def fibonacci(n):\n    "
    with specinfer.Session(target) as s:
        s.feed_text(prompt)
        s.set_prompt_logprobs(2)
        s.set_logprobs(2)
        toks, _ = s.step()
        lp = s.prompt_logprobs()
        tokens = s.tokens()
        assert [t.token for t in lp] == tokens[1:len(tokens) - len(toks)]
        assert all(t.logprob <= 0 and len(t.top) == 2 and t.top[0][1] >= t.logprob - 1e-6 for t in lp)
        assert s.step_logprobs()[0].top[0][0] == toks[0]
        with pytest.raises(specinfer.SpecinferError):
            s.set_prompt_logprobs(21)
