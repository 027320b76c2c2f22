"""specinfer: speculative decoding of language models on the CPU (ctypes bindings).

    import specinfer
    with specinfer.Registry() as reg:
        target = reg.open_target("kgram", "path=corpus.txt,k=6")
        drafter = reg.open_drafter("ngram", "n_max=4", target)
        coupler = specinfer.Coupler("greedy")
        with specinfer.Session(target, drafter, coupler) as s:
            s.feed_text("int main(")
            for chunk in s.stream(100):
                print(chunk, end="")
            print(s.stats())

Every handle frees its C object on close() (or `with`), and when garbage-collected otherwise.
Handles keep what they depend on alive (a Target its Registry, a Session its Target, Drafter
and Coupler), so the library's order of destruction holds. Failures raise SpecinferError with
the library's status code and message.

Drafters with weights (Medusa heads: "medusa") are trained for a target with
Registry.train_drafter (or `specinfer train-heads`) and opened like any other drafter.

One model, many users: Target.share() opens another target on a target's loaded model (weights
shared, a KV cache of its own); give each thread its own share and its sessions run at the same
time as the others' (the C calls release the GIL). step_many(sessions) runs one round of several
sessions with one target pass for those whose targets share a model.
"""

import ctypes
import enum
import itertools
import math
import os
import threading
import traceback
from ctypes import POINTER, byref, c_char_p, c_double, c_float, c_int32, c_size_t, c_void_p
from dataclasses import dataclass
from typing import List, Optional

from . import _lib
from ._lib import lib

__all__ = ["Code", "SpecinferError", "Registry", "Target", "Drafter", "Coupler", "Constraint", "Session",
           "Sketcher", "Draft", "DraftRequest", "ModelInfo", "Stats", "StepResult", "TokenLogprob", "TrainProgress",
           "live_handles", "step_many", "version"]


class Code(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    NOT_FOUND = 3
    IO = 4
    FORMAT = 5
    ABI_MISMATCH = 6
    UNSUPPORTED = 7
    CONFIG = 8
    STATE = 9
    CANCELLED = 10
    PLUGIN = 11
    CONTEXT_FULL = 12
    BUFFER_TOO_SMALL = 13
    INTERNAL = 14


def _code(status):
    try:
        return Code(status)
    except ValueError:
        return status


class SpecinferError(Exception):
    """A failure reported by specinfer: `code` (a Code) and the library's `message`."""

    def __init__(self, code, message):
        self.code = _code(code)
        self.message = message
        super().__init__(f"{lib.specinfer_status_str(int(code)).decode()}: {message}")


_live = 0
_live_lock = threading.Lock()


def _count(delta):
    global _live
    with _live_lock:
        _live += delta


def live_handles():
    """C objects made through these bindings and not yet freed (drafter instances included)."""
    return _live


def version():
    return lib.specinfer_version_string().decode()


def _check_msg(status, msg):
    """Raises for a non-OK status with the message the library allocated (and frees it)."""
    text = ctypes.string_at(msg.value).decode("utf-8", "replace") if msg.value else ""
    lib.specinfer_free(msg)
    if status != 0:
        raise SpecinferError(status, text)


def _check_with(status, errmsg):
    if status != 0:
        m = errmsg() or b""
        raise SpecinferError(status, m.decode("utf-8", "replace") or lib.specinfer_status_str(status).decode())


def _enc(s, what):
    b = s.encode() if isinstance(s, str) else bytes(s)
    if b"\0" in b:
        raise SpecinferError(Code.INVALID_ARGUMENT, f"{what} contains a NUL byte")
    return b


def _path(p, what):
    """A file path (str, bytes or os.PathLike) as bytes for C."""
    b = os.fsencode(p)
    if b"\0" in b:
        raise SpecinferError(Code.INVALID_ARGUMENT, f"{what} contains a NUL byte")
    return b


def _ints(seq):
    arr = (c_int32 * max(len(seq), 1))(*seq)
    return arr, len(seq)


class _Handle:
    _ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _raw(self):
        if not self._ptr:
            raise SpecinferError(Code.INVALID_ARGUMENT, f"the {type(self).__name__.lower()} is closed")
        return self._ptr


# ------------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class PluginInfo:
    name: str
    version: str
    description: str
    path: str
    has_target: bool
    has_drafter: bool
    abi_version: int


@dataclass(frozen=True)
class ModelInfo:
    vocab_size: int
    n_ctx: int
    hidden_size: int
    bos_token: int
    eos_token: int
    eot_token: int
    add_bos: bool
    name: str
    arch: str
    eog_tokens: tuple = ()  # every token that ends generation, eos and eot among them
    chat_template: str | None = None  # the model's Jinja chat template, None when it has none

    @staticmethod
    def _from(i):
        eog = tuple(i.eog_tokens[k] for k in range(i.n_eog_tokens)) if i.eog_tokens else ()
        chat = i.chat_template.decode(errors="replace") if i.chat_template else None
        return ModelInfo(i.vocab_size, i.n_ctx, i.hidden_size, i.bos_token, i.eos_token, i.eot_token,
                         bool(i.add_bos), (i.name or b"").decode(), (i.arch or b"").decode(), eog,
                         chat)


class Registry(_Handle):
    """The set of loaded plugins and the backend's threads. Usable from many threads."""

    def __init__(self, n_threads=0):
        p = _lib.RegistryParams()
        lib.specinfer_registry_params_init(byref(p))
        p.n_threads = n_threads
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_registry_create(byref(p), byref(out), byref(msg)), msg)
        self._ptr = out.value
        self._plugins = {}  # name -> _PyPlugin (kept alive while registered)
        _count(1)

    def close(self):
        """Destroys the registry; fails with STATE while targets or drafters are open."""
        if self._ptr:
            st = lib.specinfer_registry_destroy(self._ptr)
            if st != 0:
                raise SpecinferError(st, "the registry still has open targets or drafters")
            self._ptr = None
            self._plugins.clear()
            _count(-1)

    @property
    def threads(self):
        return lib.specinfer_registry_threads(self._raw())

    @property
    def plugin_path(self):
        return lib.specinfer_registry_plugin_path(self._raw()).decode()

    def plugins(self):
        out = []
        for i in range(lib.specinfer_registry_plugin_count(self._raw())):
            info = _lib.PluginInfo()
            info.struct_size = ctypes.sizeof(info)
            _check_with(lib.specinfer_registry_plugin_info(self._ptr, i, byref(info)), lambda: b"plugin_info failed")
            out.append(PluginInfo(info.name.decode(), info.version.decode(), info.description.decode(),
                                  info.path.decode(), bool(info.has_target), bool(info.has_drafter),
                                  info.abi_version))
        return out

    def load_plugin(self, path):
        msg = c_void_p()
        _check_msg(lib.specinfer_registry_load_plugin(self._raw(), _enc(path, "path"), byref(msg)), msg)

    def unload_plugin(self, name):
        msg = c_void_p()
        _check_msg(lib.specinfer_registry_unload_plugin(self._raw(), _enc(name, "name"), byref(msg)), msg)
        self._plugins.pop(name, None)

    def open_target(self, plugin, config=""):
        return Target(self, plugin, config)

    def open_drafter(self, plugin, config, target):
        return Drafter(self, plugin, config, target)

    def train_drafter(self, plugin, target, out_path, corpus=(), config="", progress=None):
        """Trains the weights of the drafter plugin `plugin` (e.g. "medusa") for `target` from the
        text files `corpus` (a list of paths, or one path; never the prompts an evaluation
        measures on) and writes them to `out_path` (checkpoints are kept beside it); open the
        result with open_drafter (for medusa: config "path=<out_path>"). `config` is the
        drafter's own key=value,... training options. The target is the trainer's for the whole
        call: no session may use it.

        `progress(report)`, if given, is called now and then with a TrainProgress; returning False
        stops the training (then SpecinferError CANCELLED); any other return goes on. An exception
        in it stops the training and is re-raised here.

        Raises SpecinferError: UNSUPPORTED when the plugin has nothing to train (every drafter but
        medusa, and Python drafters), NOT_FOUND, INVALID_ARGUMENT (e.g. an empty out_path),
        CONFIG, IO, STATE (a session uses the target), CANCELLED, and the plugin's own."""
        if isinstance(corpus, (str, bytes, os.PathLike)):
            corpus = [corpus]
        files = [_path(f, "a corpus path") for f in corpus]
        p = _lib.TrainParamsC()
        lib.specinfer_train_params_init(byref(p))
        p.config = _enc(config, "config") if config else None
        files_c = (ctypes.c_char_p * max(len(files), 1))(*files)
        p.corpus = ctypes.cast(files_c, POINTER(ctypes.c_char_p)) if files else None
        p.n_corpus = len(files)
        p.out_path = _path(out_path, "out_path")
        raised = []

        def on_progress(_user, report):
            if raised:
                return 1
            try:
                return 1 if progress(TrainProgress._from(report.contents)) is False else 0
            except BaseException as e:  # noqa: BLE001 - carried over the C frames
                raised.append(e)
                return 1

        if progress is not None:
            p.progress = _lib.TRAIN_PROGRESS_FN(on_progress)  # kept alive by p for the call
        msg = c_void_p()
        st = lib.specinfer_drafter_train(self._raw(), _enc(plugin, "plugin"), target._raw(), byref(p), byref(msg))
        if raised:
            lib.specinfer_free(msg)
            raise raised[0]
        _check_msg(st, msg)

    def register_drafter(self, name, factory, description=""):
        """Registers a drafter written in Python under `name`: `factory(config, model_info)`
        returns an object with propose(request) -> list of tokens (or (tokens, probs), or a
        Draft), and optionally begin(context) and commit(tokens). Raise SpecinferError to report a
        code."""
        plugin = _PyPlugin(name, description, factory)
        msg = c_void_p()
        _check_msg(lib.specinfer_registry_register_plugin(self._raw(), byref(plugin.descriptor), byref(msg)), msg)
        self._plugins[name] = plugin


@dataclass(frozen=True)
class TrainProgress:
    """One report of a training's progress (see Registry.train_drafter): the stage ("collect",
    running the target over the corpus, "train" or "evaluate"), the units of the stage done and
    in all (tokens, steps), the mean training loss over recent steps (None before the first),
    and per head the top-1 agreement with the target on held-out text (None before the first
    evaluation)."""
    stage: str
    done: int
    total: int
    loss: Optional[float]
    accuracy: Optional[List[float]]

    @staticmethod
    def _from(r):
        stage = (r.stage or b"").decode("utf-8", "replace") if _covers(r, "stage") else ""
        done, total = (r.done, r.total) if _covers(r, "done", "total") else (0, 0)
        loss = r.loss if _covers(r, "loss") and not math.isnan(r.loss) else None
        accuracy = None
        if _covers(r, "n_heads", "accuracy") and r.accuracy and r.n_heads > 0:
            accuracy = r.accuracy[:r.n_heads]
        return TrainProgress(stage, done, total, loss, accuracy)


# ------------------------------------------------------------------------------------------------
# Targets, drafters, couplers


class Target(_Handle):
    """A model whose text we want: a loaded model (weights, shared with the targets share() makes)
    and a KV cache of its own. Used by one thread at a time; targets sharing a model are used by
    different threads at once and closed in any order."""

    def __init__(self, registry, plugin, config=""):
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_target_open(registry._raw(), _enc(plugin, "plugin"), _enc(config, "config"),
                                             byref(out), byref(msg)), msg)
        self._ptr = out.value
        self.registry = registry
        _count(1)

    def close(self):
        """Closes the target; fails with STATE while a session or drafter uses it."""
        if self._ptr:
            st = lib.specinfer_target_destroy(self._ptr)
            if st != 0:
                raise SpecinferError(st, "the target is still used by a session or drafter")
            self._ptr = None
            _count(-1)

    def share(self):
        """Another target on the model this one has loaded: weights and tokenizer are shared, not
        loaded again, and the new target has an empty KV cache of its own. Give each thread (each
        session) its own share; the model stays loaded until the last target on it is closed, in
        any order. May be called while a session on this target runs in another thread. Raises
        UNSUPPORTED when the plugin cannot share (open the target again instead)."""
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_target_share(self._raw(), byref(out), byref(msg)), msg)
        t = Target.__new__(Target)
        t._ptr = out.value
        t.registry = self.registry
        _count(1)
        return t

    def _errmsg(self):
        return lib.specinfer_target_errmsg(self._ptr)

    def info(self):
        i = _lib.ModelInfoC()
        lib.specinfer_model_info_init(byref(i))
        _check_with(lib.specinfer_target_info(self._raw(), byref(i)), self._errmsg)
        return ModelInfo._from(i)

    def tokenize(self, text, add_special=False, parse_special=False):
        b = text.encode() if isinstance(text, str) else bytes(text)
        cap = len(b) + 8
        while True:
            buf, n = (c_int32 * cap)(), c_size_t()
            st = lib.specinfer_target_tokenize(self._raw(), b, len(b), int(add_special), int(parse_special), buf,
                                               cap, byref(n))
            if st == Code.BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value
                continue
            _check_with(st, self._errmsg)
            return list(buf[:n.value])

    def detokenize(self, tokens):
        """Token ids -> bytes of their text."""
        arr, k = _ints(tokens)
        cap = 4 * k + 16
        while True:
            buf, n = ctypes.create_string_buffer(cap), c_size_t()
            st = lib.specinfer_target_detokenize(self._raw(), arr, k, buf, cap, byref(n))
            if st == Code.BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value
                continue
            _check_with(st, self._errmsg)
            return buf.raw[:n.value]


class Drafter(_Handle):
    """A cheap proposer opened from a plugin, or from a Python drafter (register_drafter)."""

    def __init__(self, registry, plugin, config, target):
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_drafter_open(registry._raw(), _enc(plugin, "plugin"), _enc(config, "config"),
                                              target._raw(), byref(out), byref(msg)), msg)
        self._ptr = out.value
        self.registry, self.target = registry, target
        _count(1)

    def close(self):
        if self._ptr:
            st = lib.specinfer_drafter_destroy(self._ptr)
            if st != 0:
                raise SpecinferError(st, "the drafter is still used by a session")
            self._ptr = None
            _count(-1)


class Constraint(_Handle):
    """What a session's text must match (Session.set_constraint): a grammar of `kind`
    ("json_schema", "json_object", "regex" or "lark") compiled by constraint plugin `plugin`
    (default "llguidance") for the vocabulary of `target`."""

    def __init__(self, registry, target, kind, grammar="", plugin="llguidance", config=""):
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_constraint_open(registry._raw(), _enc(plugin, "plugin"), _enc(config, "config"),
                                                 target._raw(), _enc(kind, "kind"), _enc(grammar, "grammar"),
                                                 byref(out), byref(msg)), msg)
        self._ptr = out.value
        self.registry, self.target = registry, target
        _count(1)

    def fork(self):
        """A new constraint in this one's state, without compiling the grammar again."""
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_constraint_fork(self._raw(), byref(out), byref(msg)), msg)
        c = Constraint.__new__(Constraint)
        c._ptr, c.registry, c.target = out.value, self.registry, self.target
        _count(1)
        return c

    def close(self):
        if self._ptr:
            st = lib.specinfer_constraint_destroy(self._ptr)
            if st != 0:
                raise SpecinferError(st, "the constraint is still used by a session")
            self._ptr = None
            _count(-1)


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target, with its most likely alternatives
    as (token, log-probability) pairs, most likely first."""
    token: int
    logprob: float
    top: list


class Coupler(_Handle):
    """Decides which drafted tokens the target keeps: "greedy", "rejection", "gumbel", ..."""

    def __init__(self, spec):
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_coupler_create(_enc(spec, "spec"), byref(out), byref(msg)), msg)
        self._ptr = out.value
        _count(1)

    def close(self):
        if self._ptr:
            lib.specinfer_coupler_destroy(self._ptr)
            self._ptr = None
            _count(-1)

    @property
    def name(self):
        return lib.specinfer_coupler_name(self._raw()).decode()

    @property
    def is_exact(self):
        return bool(lib.specinfer_coupler_is_exact(self._raw()))

    def verify(self, vocab, p, draft, q=None, seed=0, position=0):
        """Verifies a chain: p has (len(draft) + 1) * vocab probabilities, q len(draft) * vocab
        or None. Returns (n_accepted, next_token)."""
        pa = (c_float * max(len(p), 1))(*p)
        qa = (c_float * len(q))(*q) if q else None
        da, k = _ints(draft)
        n_acc, tok, msg = c_int32(), c_int32(), c_void_p()
        _check_msg(lib.specinfer_coupler_verify(self._raw(), vocab, k, pa, len(p), qa, len(q) if q else 0, da,
                                                seed, position, byref(n_acc), byref(tok), byref(msg)), msg)
        return n_acc.value, tok.value


# ------------------------------------------------------------------------------------------------
# Sessions


@dataclass(frozen=True)
class Stats:
    n_prompt_tokens: int
    n_generated: int
    n_rounds: int
    n_target_passes: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float
    mean_accepted: float
    t_prefill_ms: float
    t_draft_ms: float
    t_verify_ms: float
    t_sample_ms: float
    t_total_ms: float
    tokens_per_second: float
    n_context_shifts: int
    n_forced_drafted: int
    n_forced_accepted: int
    t_constraint_ms: float
    n_cached_tokens: int  # text positions found cached, not scored again
    # Rounds whose drafter estimated its accepted length; the estimates' sum and the tokens kept
    # in those rounds.
    n_estimated_rounds: int
    expected_accepted: float
    estimated_rounds_accepted: float


class Session(_Handle):
    """Generates text with a target, an optional drafter (None: plain decoding) and an optional
    coupler (None: greedy at temperature 0, else rejection sampling). context_shift=True: when the
    context window is full, the older half of the text after n_keep tokens is dropped and
    generation goes on (else it fails with CONTEXT_FULL)."""

    def __init__(self, target, drafter=None, coupler=None, *, max_draft=None, adaptive_draft=None,
                 temperature=None, top_k=None, top_p=None, min_p=None, seed=None, stop=None,
                 context_shift=None, n_keep=None):
        p = _lib.SessionParamsC()
        lib.specinfer_session_params_init(byref(p))
        for k, v in dict(max_draft=max_draft, adaptive_draft=adaptive_draft, temperature=temperature,
                         top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, context_shift=context_shift,
                         n_keep=n_keep).items():
            if v is not None:
                setattr(p, k, int(v) if k in ("adaptive_draft", "context_shift") else v)
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_session_create(target._raw(), drafter._raw() if drafter else None,
                                                coupler._raw() if coupler else None, byref(p), byref(out),
                                                byref(msg)), msg)
        self._ptr = out.value
        self.target, self.drafter, self.coupler = target, drafter, coupler
        self._max_emit = p.max_draft + 1  # the most tokens a round emits
        _count(1)
        if stop:
            self.set_stop_strings(stop)

    def close(self):
        if self._ptr:
            lib.specinfer_session_destroy(self._ptr)
            self._ptr = None
            _count(-1)

    def _errmsg(self):
        return lib.specinfer_session_errmsg(self._ptr)

    def feed_text(self, text):
        b = text.encode() if isinstance(text, str) else bytes(text)
        _check_with(lib.specinfer_session_feed_text(self._raw(), b, len(b)), self._errmsg)

    def feed_tokens(self, tokens):
        arr, n = _ints(tokens)
        _check_with(lib.specinfer_session_feed_tokens(self._raw(), arr, n), self._errmsg)

    def feed_from(self, src, n_tokens):
        """Feeds this empty session the first n_tokens tokens of session `src`'s text, src being
        on a target shared with this one's model: the positions src scored are copied, not
        scored again (one prompt, several continuations)."""
        _check_with(lib.specinfer_session_feed_from(self._raw(), src._raw(), n_tokens),
                    self._errmsg)

    def set_stop_strings(self, stops):
        """The text ends right before the first of these strings (a str or a list of str; empty
        ones are ignored), across token and round boundaries; none of one is ever returned.
        Replaces the previous ones; [] clears them."""
        if isinstance(stops, (str, bytes)):
            stops = [stops]
        enc = [x.encode() if isinstance(x, str) else bytes(x) for x in stops]
        for i, b in enumerate(enc):
            if b"\0" in b:
                raise SpecinferError(Code.INVALID_ARGUMENT, f"stop string {i} holds a NUL character")
        arr = (c_char_p * max(len(enc), 1))(*enc)
        _check_with(lib.specinfer_session_set_stop_strings(self._raw(), arr, len(enc)), self._errmsg)

    def set_constraint(self, constraint):
        """The text generated from the next round on must match `constraint` (None: no
        constraint). A constraint serves one session at a time; the session keeps it alive."""
        _check_with(lib.specinfer_session_set_constraint(self._raw(), constraint._raw() if constraint else None),
                    self._errmsg)
        self.constraint = constraint

    def set_logprobs(self, top_n):
        """From the next round on, record each emitted token's log-probability with its top_n
        (0 to 20) most likely alternatives (step_logprobs); -1 turns it off."""
        _check_with(lib.specinfer_session_set_logprobs(self._raw(), int(top_n)), self._errmsg)

    def step_logprobs(self):
        """The log-probabilities of the last round's tokens: a list of TokenLogprob."""
        return self._logprobs(lib.specinfer_session_step_logprobs)

    def set_prompt_logprobs(self, top_n):
        """Record the log-probability of every token of the text fed (the prompt), from its
        second token on, with top_n (0 to 20) alternatives each, as the next steps score it
        (prompt_logprobs); -1 turns it off."""
        _check_with(lib.specinfer_session_set_prompt_logprobs(self._raw(), int(top_n)), self._errmsg)

    def prompt_logprobs(self):
        """The text's log-probabilities scored so far (set_prompt_logprobs): a list of
        TokenLogprob for its tokens 1, 2, ... (all of them once a round has run)."""
        return self._logprobs(lib.specinfer_session_prompt_logprobs)

    def _logprobs(self, fn):
        toks, lps, tt, tlp = POINTER(c_int32)(), POINTER(c_float)(), POINTER(c_int32)(), POINTER(c_float)()
        n, top = c_size_t(), c_int32()
        _check_with(fn(self._raw(), byref(toks), byref(lps), byref(tt), byref(tlp), byref(n), byref(top)),
                    self._errmsg)
        k = max(top.value, 0)
        return [TokenLogprob(toks[i], lps[i], [(tt[i * k + j], tlp[i * k + j]) for j in range(k)])
                for i in range(n.value)]

    def step_text(self):
        """The text of the last step's (or step_many's) tokens: whole UTF-8 characters, without
        end-of-generation tokens and without anything that may begin a stop string yet."""
        text, n = c_void_p(), c_size_t()
        _check_with(lib.specinfer_session_step_text(self._raw(), byref(text), byref(n)), self._errmsg)
        return ctypes.string_at(text.value, n.value).decode("utf-8", "replace") if n.value else ""

    def end_text(self):
        """Ends the text where the caller ends it (its own token budget): returns the tail held
        back because it could begin a stop string ("" when none)."""
        text, n = c_void_p(), c_size_t()
        _check_with(lib.specinfer_session_end_text(self._raw(), byref(text), byref(n)), self._errmsg)
        return ctypes.string_at(text.value, n.value).decode("utf-8", "replace") if n.value else ""

    def generate_with(self, max_tokens, fn):
        """Generates up to max_tokens tokens, calling fn(tokens, text) after each round; a false
        return stops (then SpecinferError CANCELLED). An exception in fn is re-raised."""
        raised = []

        def on_tokens(_user, toks, n, text, text_len):
            try:
                go_on = fn(toks[:n], ctypes.string_at(text, text_len).decode("utf-8", "replace"))
                return 0 if go_on else 1
            except BaseException as e:  # noqa: BLE001 - carried over the C frames
                raised.append(e)
                return 1

        cb = _lib.TOKEN_FN(on_tokens)
        st = lib.specinfer_session_generate(self._raw(), max_tokens, cb, None)
        if raised:
            raise raised[0]
        _check_with(st, self._errmsg)

    def generate(self, max_tokens):
        """Generates up to max_tokens tokens and returns their text."""
        parts = []
        self.generate_with(max_tokens, lambda _t, text: parts.append(text) or True)
        return "".join(parts)

    def stream(self, max_tokens):
        """A generator of the generated text, one chunk (whole characters) per round, up to
        max_tokens tokens or the end of the text (an end-of-generation token or a stop string).
        Each step runs one round."""
        left = max_tokens
        while left > 0:
            toks, done = self.step(left)
            left -= len(toks)
            text = self.step_text()
            if done or left <= 0:
                text += "" if done else self.end_text()
            if text:
                yield text
            if done:
                return

    def step(self, cap=None):
        """One speculate -> verify -> commit round emitting at most cap tokens (None: as many as
        the session's max_draft allows): (tokens emitted, the text ended: an end-of-generation
        token or a stop string). The round's text: step_text()."""
        cap = self._max_emit if cap is None else min(cap, self._max_emit)
        buf, n, done = (c_int32 * max(cap, 1))(), c_size_t(), c_int32()
        _check_with(lib.specinfer_session_step(self._raw(), buf, cap, byref(n), byref(done)), self._errmsg)
        return list(buf[:n.value]), bool(done.value)

    def stats(self):
        s = _lib.SessionStats()
        lib.specinfer_session_stats_init(byref(s))
        _check_with(lib.specinfer_session_get_stats(self._raw(), byref(s)), self._errmsg)
        return Stats(*(getattr(s, f) for f, _ in _lib.SessionStats._fields_[1:]))

    def reset(self):
        _check_with(lib.specinfer_session_reset(self._raw()), self._errmsg)

    def tokens(self):
        p, n = POINTER(c_int32)(), c_size_t()
        _check_with(lib.specinfer_session_tokens(self._raw(), byref(p), byref(n)), self._errmsg)
        return list(p[:n.value]) if n.value else []


@dataclass(frozen=True)
class StepResult:
    """One session's part of step_many: the tokens its round emitted (none while its prompt is
    still scored in chunks), whether the text ended (an end-of-generation token or a stop
    string), its error (a
    SpecinferError, or None when the round succeeded), and the tokens' text (whole UTF-8
    characters: one split between rounds comes whole with the later round; nothing for
    end-of-generation tokens, nor anything that may begin a stop string yet)."""
    tokens: List[int]
    done: bool
    error: Optional[SpecinferError] = None
    text: str = ""


def step_many(sessions, prefill_chunk=None):
    """Runs one round of each session, as Session.step would, with one target pass for all sessions
    whose targets share a loaded model (Target.share, or targets opened with the same plugin and
    config): the weights are read once for all of them, and each session emits exactly what its
    own step would. Continuous batching is a loop over this call with the sessions still
    generating; sessions may join and leave between calls. No other thread may use the sessions
    during the call.

    prefill_chunk: a session whose prompt is not scored yet scores at most this many of its tokens
    per call (emitting none), so a long prompt delays the others by a little per call rather than
    a whole prefill; 0 scores it whole; None is the library's default.

    Returns one StepResult per session, in order; a failing session does not stop the others. A
    call refused as a whole (a session twice, a closed session) runs nothing and raises
    SpecinferError."""
    sessions = list(sessions)
    if not sessions:
        return []
    n = len(sessions)
    ptrs = (c_void_p * n)()
    for i, s in enumerate(sessions):
        if not isinstance(s, Session):
            raise SpecinferError(Code.INVALID_ARGUMENT, f"session {i} is not a Session")
        ptrs[i] = s._raw()
    unset = -1  # a status the library never writes: still there, the session did not run
    bufs = [(c_int32 * s._max_emit)() for s in sessions]
    results = (_lib.StepResultC * n)()
    for r, s, b in zip(results, sessions, bufs):
        r.struct_size = ctypes.sizeof(_lib.StepResultC)
        r.tokens = ctypes.cast(b, POINTER(c_int32))
        r.cap = s._max_emit
        r.status = unset
    p = _lib.StepParamsC()
    lib.specinfer_step_params_init(byref(p))
    if prefill_chunk is not None:
        p.prefill_chunk = prefill_chunk
    st = lib.specinfer_session_step_many(ptrs, results, n, byref(p))
    if st != 0 and all(r.status == unset for r in results):
        message = "step_many refused the call (nothing ran)"
        seen = {}
        for i, s in enumerate(sessions):  # the library names a session given twice on that session
            if s._ptr in seen:
                message = f"sessions {seen[s._ptr]} and {i}: {(s._errmsg() or b'').decode('utf-8', 'replace')}"
            seen.setdefault(s._ptr, i)
        raise SpecinferError(st, message)
    out = []
    for r, s, b in zip(results, sessions, bufs):
        if r.status != 0:
            m = (s._errmsg() or b"").decode("utf-8", "replace") or lib.specinfer_status_str(r.status).decode()
            out.append(StepResult([], False, SpecinferError(r.status, m)))
        else:
            text, n = c_void_p(), c_size_t()
            _check_with(lib.specinfer_session_step_text(s._raw(), byref(text), byref(n)), s._errmsg)
            out.append(StepResult(list(b[:r.n_tokens]), bool(r.done), None,
                                  ctypes.string_at(text.value, n.value).decode("utf-8", "replace") if n.value else ""))
    return out


# ------------------------------------------------------------------------------------------------
# Sketchers


class Sketcher(_Handle):
    """Inner-product sketches: kind "jl", "countsketch", "qjl", "threshold" or "priority"."""

    def __init__(self, kind, dim, size, seed=0, options=""):
        out, msg = c_void_p(), c_void_p()
        _check_msg(lib.specinfer_sketcher_create(_enc(kind, "kind"), dim, size, seed, _enc(options, "options"),
                                                 byref(out), byref(msg)), msg)
        self._ptr = out.value
        self.dim = dim
        _count(1)

    def close(self):
        if self._ptr:
            lib.specinfer_sketcher_destroy(self._ptr)
            self._ptr = None
            _count(-1)

    def sketch(self, x, query=False):
        xa = (c_float * max(len(x), 1))(*x)
        flags = _lib.SKETCH_QUERY if query else 0
        need, msg = c_size_t(), c_void_p()
        st = lib.specinfer_sketcher_sketch(self._raw(), xa, len(x), flags, None, 0, byref(need), byref(msg))
        if st != Code.BUFFER_TOO_SMALL:
            _check_msg(st, msg)
        else:
            lib.specinfer_free(msg)
        buf, n, msg = ctypes.create_string_buffer(need.value), c_size_t(), c_void_p()
        _check_msg(lib.specinfer_sketcher_sketch(self._ptr, xa, len(x), flags, buf, need.value, byref(n),
                                                 byref(msg)), msg)
        return buf.raw[:n.value]

    def estimate(self, a, b):
        v, msg = c_double(), c_void_p()
        _check_msg(lib.specinfer_sketcher_estimate(self._raw(), a, len(a), b, len(b), byref(v), byref(msg)), msg)
        return v.value


# ------------------------------------------------------------------------------------------------
# Drafters written in Python


def _covers(raw, *fields):
    """True when the struct the library handed (raw.struct_size bytes) holds all these fields."""
    ends = (getattr(type(raw), f).offset + getattr(type(raw), f).size for f in fields)
    return raw.struct_size >= max(ends)


@dataclass(frozen=True)
class Draft:
    """What a Python drafter's propose may return: a chain of tokens; optionally their draft
    distributions (len(tokens) x vocab_size floats, row by row: a sampling session's coupler
    reads them); and optionally how many of the tokens the drafter expects the target to keep
    (0..len(tokens)), which the session's statistics show beside what it kept
    (Stats.expected_accepted, estimated_rounds_accepted)."""
    tokens: list
    probs: list = None
    expected_accepted: float = None


class DraftRequest:
    """What the session asks of a drafter: max_tokens, context (the committed sequence),
    temperature, seed, and sample(q, position), the coupler's draft-side sampler.

    hidden: the target's last hidden state (the input of its output layer, a list of
    hidden_size floats) at sequence index hidden_position (len(context) - 2), the position whose
    logits chose the last committed token; None when the session has none (a target without
    hidden states, such as kgram), and hidden_position is then -1.
    pass_cost: pass_cost[i] is the time of one target pass over i + 1 tokens (the last committed
    token and i drafted ones) relative to a one-token pass, as the session measured it on this
    machine; max_tokens + 1 entries, the first 1.0. A drafter that sizes its own draft weighs what
    a token is expected to add against this cost. ([] with a library older than these fields.)"""

    __slots__ = ("max_tokens", "context", "temperature", "seed", "hidden", "hidden_position", "pass_cost",
                 "_raw")

    def __init__(self, raw):
        self._raw = raw
        self.max_tokens = raw.max_tokens
        self.context = raw.context[:raw.n_context] if raw.n_context else []
        self.temperature = raw.temperature
        self.seed = raw.seed
        self.hidden, self.hidden_position, self.pass_cost = None, -1, []
        if _covers(raw, "hidden", "hidden_size", "hidden_position") and raw.hidden and raw.hidden_size > 0:
            self.hidden = raw.hidden[:raw.hidden_size]
            self.hidden_position = raw.hidden_position
        if _covers(raw, "pass_cost", "n_pass_cost") and raw.pass_cost and raw.n_pass_cost > 0:
            self.pass_cost = raw.pass_cost[:raw.n_pass_cost]

    def sample(self, q, position):
        if not self._raw.sample:
            return -1
        qa = (c_float * len(q))(*q)
        return self._raw.sample(self._raw.sample_ctx, qa, len(q), position)


def _set_err(err, text):
    b = text.encode("utf-8", "replace")[:511]
    ctypes.memmove(ctypes.addressof(err.contents), b + b"\0", len(b) + 1)


def _guard(err, f):
    try:
        f()
        return 0
    except SpecinferError as e:
        _set_err(err, e.message)
        return int(e.code) if int(e.code) != 0 else int(Code.PLUGIN)
    except BaseException as e:  # noqa: BLE001 - nothing may cross the C boundary
        _set_err(err, f"the Python drafter raised {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
        return int(Code.PLUGIN)


_instances = {}
_instance_ids = itertools.count(1)


def _inst(self_ptr):
    return _instances[self_ptr]


@_lib.DESTROY_FN
def _inst_destroy(self_ptr):
    if _instances.pop(self_ptr, None) is not None:
        _count(-1)


@_lib.BEGIN_FN
def _inst_begin(self_ptr, ctx, n, err):
    d = _inst(self_ptr)
    return _guard(err, lambda: getattr(d, "begin", None) and d.begin(ctx[:n] if n else []))


@_lib.COMMIT_FN
def _inst_commit(self_ptr, toks, n, err):
    d = _inst(self_ptr)
    return _guard(err, lambda: getattr(d, "commit", None) and d.commit(toks[:n] if n else []))


@_lib.PROPOSE_FN
def _inst_propose(self_ptr, req, out, err):
    d, o = _inst(self_ptr), out.contents
    o.n_nodes = 0
    o.has_probs = 0

    def run():
        got = d.propose(DraftRequest(req.contents))
        expected = None
        if isinstance(got, Draft):
            tokens, probs, expected = got.tokens, got.probs, got.expected_accepted
        else:
            tokens, probs = (got if isinstance(got, tuple) else (got, None))
        tokens = list(tokens or [])
        if len(tokens) > o.cap:
            raise SpecinferError(Code.INVALID_ARGUMENT, f"the draft has {len(tokens)} tokens, room for {o.cap}")
        if probs is not None and len(probs) != len(tokens) * o.vocab_size:
            raise SpecinferError(Code.INVALID_ARGUMENT,
                                 f"the draft has {len(probs)} probabilities, want {len(tokens)} x {o.vocab_size}")
        for i, t in enumerate(tokens):
            if not 0 <= t < o.vocab_size:
                raise SpecinferError(Code.INVALID_ARGUMENT, f"token {t} is outside the vocabulary")
            o.tokens[i] = t
            o.parents[i] = i - 1
        if expected is not None and not (0.0 <= expected <= len(tokens)):  # NaN included
            raise SpecinferError(Code.INVALID_ARGUMENT, f"the draft expects {expected} accepted "
                                 f"tokens, not within 0..{len(tokens)} (its length)")
        if probs is not None and tokens:
            ctypes.memmove(o.probs, (c_float * len(probs))(*probs), 4 * len(probs))
            o.has_probs = 1
        o.n_nodes = len(tokens)
        # A host whose draft has the field (struct_size covers it) shows the estimate.
        if expected is not None and o.struct_size >= _lib.DraftC.expected_accepted.offset + 8:
            o.expected_accepted = float(expected)

    st = _guard(err, run)
    if st != 0:
        o.n_nodes = 0
    return st


_VTABLE = _lib.DrafterVtable(ctypes.sizeof(_lib.DrafterVtable), _inst_destroy, _inst_begin, _inst_propose,
                             _inst_commit)


class _PyPlugin:
    """The descriptor, factory and callbacks of one Python drafter (closures: no slots needed)."""

    def __init__(self, name, description, factory):
        self.strings = [_enc(name, "name"), _enc(version(), "version"), _enc(description, "description")]

        def create(_host, config, info, _target, self_out, vt_out, err):
            def run():
                obj = factory((config or b"").decode(), ModelInfo._from(info.contents))
                if obj is None:
                    raise SpecinferError(Code.PLUGIN, "the drafter factory returned None")
                key = next(_instance_ids)
                _instances[key] = obj
                _count(1)
                self_out[0] = key
                vt_out[0] = ctypes.addressof(_VTABLE)

            return _guard(err, run)

        self.create = _lib.CREATE_FN(create)
        # train stays NULL: a Python drafter has no weights to train (drafter_train says so).
        self.factory = _lib.DrafterFactoryC(ctypes.sizeof(_lib.DrafterFactoryC), self.create, _lib.TRAIN_FN())

        def get_factory(fid):
            return ctypes.addressof(self.factory) if fid == _lib.DRAFTER_FACTORY_ID else None

        self.get_factory = _lib.GET_FACTORY_FN(get_factory)
        self.descriptor = _lib.PluginDescriptor(_lib.PLUGIN_ABI_VERSION, ctypes.sizeof(_lib.PluginDescriptor),
                                                self.strings[0], self.strings[1], self.strings[2], None, None,
                                                self.get_factory)

