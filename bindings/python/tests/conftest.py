import os
import pathlib

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
