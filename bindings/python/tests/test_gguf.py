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
