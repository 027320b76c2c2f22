"""One loaded model, many users: shares of one kgram target run sessions in several threads at
once, and step_many steps several sessions together; every text equals a lone session's."""
import threading

import pytest

import specinfer
from specinfer import Code, SpecinferError

from conftest import PROMPT, kgram

PROMPTS = [PROMPT, "typedef struct specinfer_", "/* Runs one round of each"]


def lone(registry, prompt, n, drafter):
    """The first n tokens a lone session on its own target generates after prompt (greedy)."""
    target = kgram(registry)
    d = registry.open_drafter("ngram", "", target) if drafter else None
    with specinfer.Session(target, d, max_draft=6) as s:
        s.feed_text(prompt)
        s.generate(n)
        return s.tokens()[len(prompt):]


def test_shared_targets_run_sessions_in_threads(registry):
    root = kgram(registry)
    shares = [root.share() for _ in range(4)]
    assert shares[0].info() == root.info()
    root.close()  # the shares keep the model
    want = [lone(registry, PROMPTS[i % 3], 120, i % 2 == 0) for i in range(4)]
    coupler = specinfer.Coupler("greedy")
    got, errors = [None] * 4, []

    def run(i, target):
        try:
            d = registry.open_drafter("ngram", "", target) if i % 2 == 0 else None
            with specinfer.Session(target, d, coupler, max_draft=6) as s:
                s.feed_text(PROMPTS[i % 3])
                s.generate(120)
                got[i] = s.tokens()[len(PROMPTS[i % 3]):]
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(shares)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert all(len(g) == 120 for g in got)
    assert got == want


@pytest.mark.parametrize("chunk", [0, 4])
def test_step_many_equals_lone_sessions(registry, chunk):
    n = 100
    want = [lone(registry, PROMPTS[i], n, i != 1) for i in range(3)]
    root = kgram(registry)
    sessions = []
    for i in range(3):
        t = root.share()
        d = registry.open_drafter("ngram", "", t) if i != 1 else None
        s = specinfer.Session(t, d, max_draft=6)
        s.feed_text(PROMPTS[i])
        sessions.append(s)
    got = [[] for _ in sessions]
    texts = ["" for _ in sessions]
    calls = 0
    while any(len(g) < n for g in got):
        for i, r in enumerate(specinfer.step_many(sessions, prefill_chunk=chunk)):
            assert r.error is None and not r.done, r
            got[i].extend(r.tokens)
            texts[i] += r.text
        calls += 1
        assert calls < 10 * n, "step_many makes no progress"
    # kgram's tokens are bytes: each round's text is its tokens' bytes.
    assert [t.encode() for t in texts] == [bytes(g) for g in got]
    assert [g[:n] for g in got] == want
    for s in sessions:
        s.close()


def test_step_many_errors(registry):
    root = kgram(registry, 4)
    sa = specinfer.Session(root.share(), max_draft=6)
    sb = specinfer.Session(root.share(), max_draft=6)
    sa.feed_text(PROMPT)
    # A session twice: the library refuses the whole call, nothing runs.
    before = len(sa.tokens())
    with pytest.raises(SpecinferError) as e:
        specinfer.step_many([sa, sa])
    assert e.value.code == Code.INVALID_ARGUMENT
    assert "same session" in e.value.message
    assert len(sa.tokens()) == before
    with pytest.raises(SpecinferError) as e:
        specinfer.step_many([sa], prefill_chunk=-1)
    assert e.value.code == Code.INVALID_ARGUMENT
    # sb has no prompt: its round fails with the library's code and message; sa's runs.
    ra, rb = specinfer.step_many([sa, sb], prefill_chunk=0)
    assert ra.error is None and ra.tokens
    assert isinstance(rb.error, SpecinferError) and rb.error.code == Code.STATE
    assert "feed" in rb.error.message
    # A closed session, or something else, is refused before the library is called.
    sb.close()
    with pytest.raises(SpecinferError) as e:
        specinfer.step_many([sa, sb])
    assert e.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(SpecinferError):
        specinfer.step_many([sa, "not a session"])
    assert specinfer.step_many([]) == []
    sa.close()


def test_feed_from_continues_another_sessions_prompt(registry):
    """A session fed another's prompt (feed_from) continues it as a session fed the prompt does
    (kgram cannot copy its cache: the prompt is scored again, the text is the same)."""
    want = lone(registry, PROMPT, 40, False)
    root = kgram(registry)
    with specinfer.Session(root.share(), max_draft=6) as src, \
            specinfer.Session(root.share(), max_draft=6) as s:
        src.feed_text(PROMPT)
        src.generate(5)
        s.feed_from(src, len(PROMPT))
        s.generate(40)
        assert s.tokens()[len(PROMPT):] == want
        with pytest.raises(SpecinferError) as e:
            s.feed_from(src, 1)
        assert e.value.code == Code.STATE
