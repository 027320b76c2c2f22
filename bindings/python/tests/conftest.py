import os
import pathlib
import shutil
import subprocess

import pytest

import specinfer

PROMPT = "/* Creates a session that generates with"


def corpus():
    """The training text of the kgram target: $SPECINFER_TEST_CORPUS, else abi/specinfer.h."""
    env = os.environ.get("SPECINFER_TEST_CORPUS")
    if env:
        return env
    return str(pathlib.Path(__file__).resolve().parents[3] / "abi" / "specinfer.h")


@pytest.fixture
def registry():
    # Not closed explicitly: a test's targets and drafters (which keep the registry alive) may
    # still be referenced by pytest's exception info; the registry goes when they do.
    yield specinfer.Registry(2)


def kgram(reg, k=6):
    return reg.open_target("kgram", f"path={corpus()},k={k}")


def generate(target, drafter=None, coupler=None, max_tokens=300):
    with specinfer.Session(target, drafter, coupler, max_draft=6) as s:
        s.feed_text(PROMPT)
        text = s.generate(max_tokens)
        return text, s.stats()


class Lookup:
    """Prompt lookup written in Python: proposes what followed the latest earlier occurrence of
    the context's last n tokens."""

    def __init__(self, n_max=3):
        self.n_max = n_max
        self.begins = 0
        self.commits = 0

    def begin(self, context):
        self.begins += 1

    def commit(self, tokens):
        self.commits += 1

    def propose(self, req):
        ctx = req.context
        for n in range(min(self.n_max, len(ctx) - 1), 0, -1):
            tail = ctx[-n:]
            for s in range(len(ctx) - n - 1, -1, -1):
                if ctx[s:s + n] == tail:
                    return ctx[s + n:s + n + req.max_tokens]
        return []


class Probe(Lookup):
    """Records what each request holds (hidden state, its position, pass costs, context length,
    max_tokens), then drafts by prompt lookup."""

    def __init__(self, n_max=3):
        super().__init__(n_max)
        self.seen = []

    def propose(self, req):
        self.seen.append((req.hidden, req.hidden_position, req.pass_cost, len(req.context), req.max_tokens))
        return super().propose(req)


def check_seen(seen, hidden_size, want_hidden):
    """Hidden states of hidden_size floats at len(context) - 2 (some when want_hidden, else
    none), and max_tokens + 1 pass costs starting at 1."""
    assert seen, "the drafter saw no request"
    for hidden, position, cost, n_context, max_tokens in seen:
        if hidden is None:
            assert position == -1
        else:
            assert len(hidden) == hidden_size and position == n_context - 2
        assert len(cost) == max_tokens + 1 and cost[0] == 1.0, cost
        assert all(0 < c < float("inf") for c in cost), cost
    assert any(s[0] is not None for s in seen) == want_hidden


@pytest.fixture(scope="session")
def train_probe_plugin(tmp_path_factory):
    """bindings/testdata/train_probe.c (a drafter plugin whose training only reports progress and
    writes down its parameters), compiled with the C compiler; the test is skipped without one."""
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        pytest.skip(f"no C compiler ({cc}) to build the train-probe plugin")
    include = subprocess.run(["pkg-config", "--variable=includedir", "specinfer"], capture_output=True, text=True,
                             check=True).stdout.strip()
    src = pathlib.Path(__file__).resolve().parents[2] / "testdata" / "train_probe.c"
    so = tmp_path_factory.mktemp("probe") / "train-probe.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), f"-I{include}", str(src)], check=True)
    return str(so)
