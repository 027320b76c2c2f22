import gc
import threading

import pytest

import specinfer
from specinfer import Code, SpecinferError

from conftest import PROMPT, Lookup, Probe, check_seen, corpus, generate, kgram


def test_ngram_drafter_gives_the_plain_greedy_text(registry):
    target = kgram(registry)
    plain, st0 = generate(target)
    assert st0.n_drafted == 0 and st0.n_generated == 300
    drafter = registry.open_drafter("ngram", "n_max=4", target)
    spec, st = generate(target, drafter, specinfer.Coupler("greedy"))
    assert spec == plain and plain
    assert st.n_accepted > 0
    assert st.n_target_passes < st0.n_target_passes


@pytest.mark.parametrize("coupler", ["greedy", "gumbel"])
def test_python_drafter_gives_the_plain_greedy_text(registry, coupler):
    made = []

    def factory(config, info):
        if config:
            raise SpecinferError(Code.CONFIG, f"lookup-py takes no config, got '{config}'")
        assert info.vocab_size == 256 and info.arch == "kgram"
        made.append(Lookup())
        return made[-1]

    registry.register_drafter("lookup-py", factory, "prompt lookup in Python")
    info = [p for p in registry.plugins() if p.name == "lookup-py"][0]
    assert info.has_drafter and not info.has_target and info.path == ""
    target = kgram(registry)
    plain, _ = generate(target)
    drafter = registry.open_drafter("lookup-py", "", target)
    spec, st = generate(target, drafter, specinfer.Coupler(coupler))
    assert spec == plain
    assert st.n_accepted > 0
    assert made[0].begins == 1 and made[0].commits > 0
    with pytest.raises(SpecinferError) as e:
        registry.open_drafter("lookup-py", "x=1", target)
    assert e.value.code == Code.CONFIG
    assert "lookup-py takes no config, got 'x=1'" in e.value.message
    with pytest.raises(SpecinferError) as e:
        registry.register_drafter("lookup-py", factory)
    assert e.value.code == Code.STATE


def test_python_drafter_sees_no_hidden_state_and_the_pass_costs_with_kgram(registry):
    probes = []
    registry.register_drafter("probe-py", lambda cfg, info: probes.append(Probe()) or probes[-1])
    target = kgram(registry)
    plain, _ = generate(target, max_tokens=200)
    spec, st = generate(target, registry.open_drafter("probe-py", "", target), max_tokens=200)
    assert spec == plain and st.n_drafted > 0
    # kgram has no hidden state (hidden_size 0).
    check_seen(probes[0].seen, 0, False)


class Expecting(Lookup):
    """Prompt lookup that expects the target to keep half of each draft (a Draft with
    expected_accepted), and sums what it said."""

    def __init__(self):
        super().__init__()
        self.said, self.rounds = 0.0, 0

    def propose(self, req):
        tokens = super().propose(req)
        if not tokens:
            return []
        self.said += len(tokens) / 2
        self.rounds += 1
        return specinfer.Draft(tokens, expected_accepted=len(tokens) / 2)


def test_python_drafter_reports_the_accepted_length_it_expects(registry):
    made = []
    registry.register_drafter("expecting-py", lambda cfg, info: made.append(Expecting()) or made[-1])
    target = kgram(registry)
    plain, _ = generate(target)
    spec, st = generate(target, registry.open_drafter("expecting-py", "", target))
    assert spec == plain
    assert made[0].rounds > 0 and st.n_estimated_rounds == made[0].rounds
    assert st.expected_accepted == pytest.approx(made[0].said)
    assert 0 < st.estimated_rounds_accepted <= st.n_accepted


class Failing:
    def __init__(self, how):
        self.how = how

    def propose(self, req):
        if self.how == "raise":
            raise RuntimeError("the oracle is out of tea")
        if self.how == "bad-token":
            return [100000]
        if self.how == "bad-expected":
            return specinfer.Draft([1, 2], expected_accepted=3.0)  # more than its tokens
        return [1, 2], [0.5]  # wrong number of probabilities


@pytest.mark.parametrize("how,want", [("raise", "the oracle is out of tea"),
                                      ("bad-token", "outside the vocabulary"),
                                      ("bad-probs", "probabilities"),
                                      ("bad-expected", "expects 3.0 accepted tokens, not within 0..2")])
def test_drafter_errors_reach_the_caller(registry, how, want):
    registry.register_drafter("failing-py", lambda cfg, info: Failing(cfg))
    target = kgram(registry, 4)
    drafter = registry.open_drafter("failing-py", how, target)
    with specinfer.Session(target, drafter) as s:
        s.feed_text(PROMPT)
        with pytest.raises(SpecinferError) as e:
            s.generate(20)
    assert e.value.code in (Code.PLUGIN, Code.INVALID_ARGUMENT)
    assert want in e.value.message


def test_stream_yields_the_generated_text(registry):
    target = kgram(registry)
    whole, _ = generate(target, max_tokens=120)
    drafter = registry.open_drafter("ngram", "", target)
    with specinfer.Session(target, drafter, max_draft=6) as s:
        s.feed_text(PROMPT)
        chunks = list(s.stream(120))
        st = s.stats()
        assert "".join(chunks) == whole
        assert len(chunks) > 1 and len(chunks) == st.n_rounds
        assert st.n_generated == 120
        assert len(s.tokens()) == st.n_prompt_tokens + 120
        # Stopping early runs no more rounds.
        s.reset()
        s.feed_text(PROMPT)
        first = next(s.stream(120))
        assert whole.startswith(first)
        assert s.stats().n_rounds == 1


@pytest.mark.parametrize("how", ["generate", "stream", "step_many"])
def test_stop_strings_end_the_text_before_them(registry, how):
    target = kgram(registry)
    whole, _ = generate(target, max_tokens=120)
    stop = whole[40:46]  # six characters: the text ends at their first occurrence
    cut = whole.index(stop)
    drafter = registry.open_drafter("ngram", "", target)
    with specinfer.Session(target, drafter, max_draft=6, stop=[stop, "\x01never"]) as s:
        s.feed_text(PROMPT)
        if how == "generate":
            text = s.generate(120)
        elif how == "stream":
            text = "".join(s.stream(120))
        else:
            parts = []
            while True:
                (r,) = specinfer.step_many([s])
                assert r.error is None
                parts.append(r.text)
                if r.done:
                    break
            text = "".join(parts)
        assert text == whole[:cut]
        # The session's text ends with the token that completed the stop string (kgram: a byte).
        assert len(s.tokens()) == s.stats().n_prompt_tokens + cut + len(stop)


def test_stop_strings_hold_back_only_what_may_begin_one(registry):
    target = kgram(registry)
    whole, _ = generate(target, max_tokens=60)
    with specinfer.Session(target, max_draft=6) as s:
        s.set_stop_strings(whole[29] + "\x01")  # begins at the 30th character, never completes
        s.feed_text(PROMPT)
        parts = []
        for _ in range(30):
            toks, done = s.step(1)
            assert len(toks) == 1 and not done
            parts.append(s.step_text())
        assert "".join(parts) == whole[:29]
        assert s.end_text() == whole[29]
        assert s.end_text() == ""
        with pytest.raises(SpecinferError) as e:
            s.set_stop_strings(["x"] * 65)
        assert e.value.code == Code.INVALID_ARGUMENT and "at most 64" in str(e.value)
        with pytest.raises(SpecinferError):
            s.set_stop_strings("a\0b")
        s.set_stop_strings([])


def test_bad_input_raises_with_the_library_message(registry):
    with pytest.raises(SpecinferError) as e:
        registry.open_target("no-such-plugin", "")
    assert e.value.code == Code.NOT_FOUND and "no-such-plugin" in e.value.message
    with pytest.raises(SpecinferError) as e:
        registry.open_target("kgram", f"path={corpus()},bogus=3")
    assert e.value.code == Code.CONFIG and "bogus" in e.value.message
    with pytest.raises(SpecinferError) as e:
        specinfer.Coupler("lenient:7")
    assert e.value.code == Code.CONFIG
    assert str(e.value).startswith("SPECINFER_ERR_CONFIG: ")
    target = kgram(registry, 4)
    with pytest.raises(SpecinferError) as e:
        specinfer.Session(target, temperature=-1.0)
    assert e.value.code == Code.INVALID_ARGUMENT and "temperature" in e.value.message
    s = specinfer.Session(target)
    with pytest.raises(SpecinferError) as e:
        s.generate(10)
    assert e.value.code == Code.STATE and "feed" in e.value.message
    with pytest.raises(SpecinferError) as e:
        s.feed_tokens([7, 999])
    assert e.value.code == Code.INVALID_ARGUMENT
    with pytest.raises(SpecinferError) as e:
        target.close()  # a session still uses it
    assert e.value.code == Code.STATE
    s.feed_text(PROMPT)
    with pytest.raises(SpecinferError) as e:
        s.generate_with(50, lambda toks, text: False)
    assert e.value.code == Code.CANCELLED
    with pytest.raises(ZeroDivisionError):
        s.generate_with(50, lambda toks, text: 1 / 0)
    s.close()
    ids = target.tokenize("héllo")
    assert len(ids) == 6 and target.detokenize(ids) == "héllo".encode()
    with pytest.raises(SpecinferError) as e:
        target.detokenize([300])
    assert e.value.code == Code.INVALID_ARGUMENT and e.value.message
    c = specinfer.Coupler("rejection")
    assert c.is_exact and c.name == "rejection"
    assert c.verify(2, [0, 1, 0, 1], [1], seed=7, position=3) == (1, 1)
    with pytest.raises(SpecinferError) as e:
        c.verify(2, [0.5, 0.7, 0, 1], [1])
    assert e.value.code == Code.INVALID_ARGUMENT


def test_sketcher():
    with specinfer.Sketcher("jl", 64, 512, 42) as sk:
        import math
        a = [math.sin(i * 0.37) for i in range(64)]
        b = [x + 0.1 for x in a]
        exact = sum(x * y for x, y in zip(a, b))
        sa, sb = sk.sketch(a), sk.sketch(b)
        assert sk.sketch(a) == sa
        assert abs(sk.estimate(sa, sb) - exact) < 8.0  # about 4 standard deviations
        with pytest.raises(SpecinferError) as e:
            sk.estimate(sa[:10], sb)
        assert e.value.code == Code.FORMAT


def test_concurrent_sessions(registry):
    target = kgram(registry)
    plain, _ = generate(target, max_tokens=80)
    target.close()
    coupler = specinfer.Coupler("greedy")
    registry.register_drafter("lookup-py", lambda cfg, info: Lookup())
    out = [None] * 3

    def run(i):
        t = kgram(registry)
        d = registry.open_drafter("lookup-py" if i % 2 else "ngram", "", t)
        out[i] = generate(t, d, coupler, 80)[0]
        d.close()
        t.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [plain] * 3


def test_no_handle_leaks():
    gc.collect()
    base = specinfer.live_handles()
    with specinfer.Registry(1) as reg:
        reg.register_drafter("lookup-py", lambda cfg, info: Lookup())
        target = kgram(reg, 4)
        drafter = reg.open_drafter("lookup-py", "", target)
        assert specinfer.live_handles() - base == 4  # registry, target, drafter, Python instance
        generate(target, drafter, max_tokens=40)
        drafter.close()
        target.close()
        reg.unload_plugin("lookup-py")
    assert specinfer.live_handles() == base

    # Never closed: garbage collection frees them in a valid order.
    def forget():
        reg = specinfer.Registry(1)
        reg.register_drafter("lookup-py", lambda cfg, info: Lookup())
        t = kgram(reg, 4)
        d = reg.open_drafter("lookup-py", "", t)
        s = specinfer.Session(t, d, specinfer.Coupler("greedy"))
        s.feed_text(PROMPT)
        s.generate(20)
        assert specinfer.live_handles() - base == 6

    forget()
    gc.collect()
    assert specinfer.live_handles() == base


def test_context_shift_goes_on_past_a_full_window(registry):
    target = registry.open_target("kgram", f"path={corpus()},k=4,n_ctx=64")
    with specinfer.Session(target) as s:
        s.feed_text(PROMPT)
        with pytest.raises(SpecinferError) as e:
            s.generate(200)
        assert e.value.code == Code.CONTEXT_FULL
    with specinfer.Session(target, context_shift=True, n_keep=8) as s:
        s.feed_text(PROMPT)
        s.generate(200)
        st = s.stats()
        assert st.n_generated == 200 and st.n_context_shifts >= 3
