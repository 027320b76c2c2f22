"""specinfer on Ray Serve: replicas of `specinfer serve`, one loaded model each, behind one
OpenAI-compatible ingress.

Each replica (``SpecinferReplica``) starts ``specinfer serve`` as its child process on a free
local port and hands it every request unchanged: the OpenAI request parser, the continuous
batching of the replica's sessions on its one loaded model, speculation, streaming, errors and
``/metrics`` are the server's own, so a replica answers exactly what ``specinfer serve`` answers.
The ingress (``Ingress``) reads only what routing needs (the prompt or the messages) and streams
the replica's answer back with an ``x-specinfer-replica`` header naming the replica.

Routing keeps caches warm: ``PrefixAffinityRouter`` (a Ray Serve request router) sends a request
to the replica that served the longest matching prefix of its text (a conversation's earlier
turns, a shared system prompt), whose server still holds that prefix's KV cache, while that
replica has at most ``imbalance`` more requests queued than the least loaded candidate; otherwise
it takes the shorter queue of two replicas chosen at random, as Ray's default router does.
``routing="round-robin"`` (Ray's power-of-two choice alone) turns affinity off.

A replica whose server dies fails its health check; Ray replaces it, and its requests in flight
end with a 502 error naming the replica, while the other replicas keep serving.

Use it from ``scripts/serve-ray`` or as a library::

    from specinfer.ray_serve import build_app
    serve.run(build_app(["--target", "gguf:path=model.gguf"], replicas=2))
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, List, Optional

import aiohttp
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

REPLICA_HEADER = "x-specinfer-replica"
APP_NAME = "specinfer"  # the Ray Serve application scripts/serve-ray deploys

# Request headers the replica's server sees (the rest, hop-by-hop ones included, stay behind).
_FORWARDED_HEADERS = ("content-type", "accept", "authorization")


@dataclass
class Forward:
    """One HTTP request as the ingress hands it to a replica.

    ``messages`` is what the prefix-aware router matches on: a chat request's messages, a
    completion's prompt, or "" for requests that carry no text.
    """

    method: str
    path: str
    query: str
    body: bytes
    headers: dict = field(default_factory=dict)
    messages: Any = ""


def routing_text(path: str, body: bytes) -> Any:
    """The prompt or messages of a request body, for routing only ("" when there is none or the
    body is not JSON: the replica's server then answers the request with its own error)."""
    if not body:
        return ""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(doc, dict):
        return ""
    text = doc.get("messages") if path.endswith("/chat/completions") else doc.get("prompt")
    return text if isinstance(text, (str, list)) else ""


def _text_of(messages: Any) -> str:
    """One string for a prompt or a chat's messages (roles and contents, in order)."""
    if isinstance(messages, str):
        return messages
    if not isinstance(messages, list):
        return ""
    parts = []
    for m in messages:
        if isinstance(m, dict):
            content = m.get("content")
            if isinstance(content, list):  # content parts: their texts
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            parts.append(f"<{m.get('role', '')}>{content if isinstance(content, str) else ''}")
        elif isinstance(m, str):
            parts.append(m)
    return "".join(parts)


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Routes a request to the replica that served the longest prefix of its text (see the
    module's description). Prefixes are remembered in blocks of BLOCK characters, each block's key
    a hash of the text up to its end, at most `max_blocks` of them (least recently used go)."""

    BLOCK = 64

    def initialize_state(self, imbalance: int = 4, max_blocks: int = 200_000, **kwargs):
        self._imbalance = imbalance
        self._max_blocks = max_blocks
        self._owner: "OrderedDict[bytes, Any]" = OrderedDict()  # block key -> replica id

    @classmethod
    def _keys(cls, pending: Optional[PendingRequest]) -> List[bytes]:
        text = ""
        if pending is not None:
            for arg in pending.args:  # a Forward (by its field: the class may come pickled)
                if hasattr(arg, "messages"):
                    text = _text_of(arg.messages)
                    break
        h = hashlib.blake2b(digest_size=16)
        keys = []
        data = text.encode("utf-8", "surrogatepass")
        for end in range(cls.BLOCK, len(data) + 1, cls.BLOCK):
            h.update(data[end - cls.BLOCK:end])
            keys.append(h.copy().digest())
        return keys

    def _queue(self, replica: RunningReplica) -> int:
        n = self.replica_queue_len_cache.get(replica.replica_id)
        return 0 if n is None else n

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id: r for r in candidate_replicas}
        keys = self._keys(pending_request)
        chosen = None
        for key in reversed(keys):  # the longest prefix first
            owner = by_id.get(self._owner.get(key))
            if owner is None:
                continue
            shortest = min(self._queue(r) for r in candidate_replicas)
            if self._queue(owner) - shortest <= self._imbalance:
                chosen = owner
            break
        if chosen is None:  # the shorter queue of two at random
            chosen = min(random.sample(candidate_replicas, min(2, len(candidate_replicas))),
                         key=self._queue)
        # Remembered as chosen: Ray calls no hook once a request is sent (without its rejection
        # protocol), and the first rank is where it goes unless that replica is full.
        for key in keys:
            self._owner[key] = chosen.replica_id
            self._owner.move_to_end(key)
        while len(self._owner) > self._max_blocks:
            self._owner.popitem(last=False)
        others = [r for r in candidate_replicas if r is not chosen]
        return [[chosen], others] if others else [[chosen]]


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGTERM when the replica's process ends,
    however it ends (Ray kills replicas it replaces or scales away), so no server is orphaned."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _error(message: str) -> bytes:
    """An OpenAI-shaped server error body."""
    return json.dumps({"error": {"message": message, "type": "server_error"}}).encode()


class SpecinferReplica:
    """A replica: one ``specinfer serve`` child process and the requests Ray routes to it."""

    def __init__(self, serve_args: list, specinfer_bin: Optional[str] = None,
                 start_timeout_s: float = 600.0):
        binary = specinfer_bin or os.environ.get("SPECINFER_BIN") or shutil.which("specinfer")
        if not binary:
            raise RuntimeError("specinfer serve: no `specinfer` command (set SPECINFER_BIN or PATH)")
        try:
            context = serve.get_replica_context()
            self.name = f"{context.deployment}#{context.replica_id.unique_id}"
        except Exception:  # outside Ray Serve (tests of the class alone)
            self.name = f"specinfer#{os.getpid()}"
        args = [binary, "serve", *serve_args, "--host", "127.0.0.1", "--port", "0"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, bufsize=1,
                                     preexec_fn=_die_with_parent)
        self.log: deque = deque(maxlen=40)  # the server's last lines, for errors
        self.port = self._wait_listening(start_timeout_s)
        threading.Thread(target=self._drain, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"
        self._client: Optional[aiohttp.ClientSession] = None

    def _wait_listening(self, timeout_s: float) -> int:
        # The server prints "... listening on http://127.0.0.1:PORT" once its models are loaded.
        timer = threading.Timer(timeout_s, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stderr:
                line = line.rstrip("\n")
                self.log.append(line)
                print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
                marker = "listening on http://127.0.0.1:"
                if marker in line:
                    return int(line.split(marker, 1)[1].split()[0].rstrip("/"))
        finally:
            timer.cancel()
        code = self.proc.wait()
        raise RuntimeError(f"specinfer serve exited with status {code} before listening: "
                           + " | ".join(self.log))

    def _drain(self) -> None:
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.log.append(line)
            print(f"[{self.name}] {line}", file=sys.stderr, flush=True)

    def _session(self) -> aiohttp.ClientSession:
        if self._client is None or self._client.closed:
            # No total timeout: a long generation streams for as long as it takes.
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._client

    def _lost(self) -> str:
        code = self.proc.poll()
        state = f"exited with status {code}" if code is not None else "stopped answering"
        return f"replica {self.name}: its specinfer serve {state}"

    async def check_health(self) -> None:
        """Ray calls this periodically; raising makes Ray replace the replica."""
        if self.proc.poll() is not None:
            raise RuntimeError(self._lost())
        try:
            async with self._session().get(self.base + "/health",
                                           timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    raise RuntimeError(f"replica {self.name}: /health answered {r.status}")
        except aiohttp.ClientError as e:
            raise RuntimeError(f"{self._lost()}: {e}") from e

    async def forward(self, req: Forward) -> AsyncIterator[Any]:
        """Yields (status, content type, replica name), then the body's bytes as they come. A
        request that never reached a server that is gone yields (None, None, name): the ingress
        sends it to another replica, and this replica's process ends so that Ray replaces it at
        once instead of at its next failed health check."""
        url = self.base + req.path + (("?" + req.query) if req.query else "")
        if self.proc.poll() is not None:
            asyncio.get_running_loop().call_later(0.2, os._exit, 1)
            yield (None, None, self.name)
            return
        started = False
        try:
            async with self._session().request(req.method, url, data=req.body or None,
                                               headers=req.headers) as r:
                yield (r.status, r.headers.get("content-type", "application/json"), self.name)
                started = True
                async for chunk in r.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            # A server killed a moment ago resets connections before it has exited: give it a
            # second to show whether it is gone.
            dead = not started and await _exits_within(self.proc, 1.0)
            message = f"{self._lost()} ({type(e).__name__})"
            if not started and (dead or isinstance(e, aiohttp.ClientConnectorError)):
                # No answer began, and the server is gone (or was never reached): the request
                # has no effect to repeat, so the ingress sends it to another replica.
                if dead:
                    asyncio.get_running_loop().call_later(0.2, os._exit, 1)
                yield (None, None, self.name)
                return
            if not started:
                yield (502, "application/json", self.name)
                yield _error(message)
            else:  # a stream cut short: end it with an error event the client can read
                yield b"data: " + _error(message) + b"\n\n"

    def __del__(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _exits_within(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether proc has exited or exits within `seconds`."""
    deadline = time.monotonic() + seconds
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


class Ingress:
    """The HTTP front: every path goes to a replica, with the replica's name in a header."""

    def __init__(self, replicas) -> None:
        # One streaming handle for every request: its router keeps the prefix affinity state.
        self.replicas = replicas.options(stream=True)

    ATTEMPTS = 4  # replicas tried for a request that reached none of their servers

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        if path == "/health":
            return self._health()
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}
        req = Forward(request.method, path, request.url.query, body, headers,
                      routing_text(path, body))
        problem = "no replica answered"
        for attempt in range(self.ATTEMPTS):
            stream = self.replicas.forward.remote(req)
            try:
                status, content_type, replica = await stream.__anext__()
            except Exception as e:  # the replica's actor died, or none is there
                problem = f"{type(e).__name__}: {e}"
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            if status is not None:
                break
            problem = f"replica {replica} had lost its server"
            await asyncio.sleep(0.5 * (attempt + 1))
        else:
            return JSONResponse({"error": {"message": f"no replica could serve the request "
                                           f"({problem})", "type": "server_error"}},
                                status_code=503)

        async def rest() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            except Exception as e:  # the replica's actor died mid-stream
                yield b"data: " + _error(f"replica {replica} failed: {e}") + b"\n\n"

        return StreamingResponse(rest(), status_code=status, media_type=content_type,
                                 headers={REPLICA_HEADER: replica})

    def _health(self) -> Response:
        """200 while every replica the deployment wants is running, 503 while none is; between
        the two (a replica being replaced, or scaling up) 200 with status "degraded"."""
        try:
            app = serve.status().applications[APP_NAME]
            states = app.deployments["specinfer"].replica_states
        except Exception as e:
            return JSONResponse({"status": "unknown", "error": str(e)}, status_code=503)
        running = int(states.get("RUNNING", 0))
        total = int(sum(states.values()))
        status = "ok" if running and running == total else ("degraded" if running else "down")
        return JSONResponse({"status": status, "replicas": {k: int(v) for k, v in states.items()}},
                            status_code=200 if running else 503)


def build_app(serve_args: list, replicas: int = 1, min_replicas: Optional[int] = None,
              max_replicas: Optional[int] = None, target_ongoing_requests: float = 4.0,
              routing: str = "prefix", imbalance: int = 4, specinfer_bin: Optional[str] = None,
              threads_per_replica: float = 1.0):
    """The Ray Serve application: an ingress and `replicas` copies of `specinfer serve
    *serve_args` (fixed), or between min_replicas and max_replicas scaled on the requests each
    replica has in flight (Ray Serve autoscaling, target_ongoing_requests per replica)."""
    if routing not in ("prefix", "round-robin"):
        raise ValueError(f"routing must be 'prefix' or 'round-robin', not {routing!r}")
    options: dict = {
        "ray_actor_options": {"num_cpus": threads_per_replica},
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 30.0,
        "max_ongoing_requests": 64,
    }
    if min_replicas is not None or max_replicas is not None:
        lo = 1 if min_replicas is None else min_replicas
        hi = max(lo, replicas if max_replicas is None else max_replicas)
        options["autoscaling_config"] = {
            "min_replicas": lo, "max_replicas": hi, "initial_replicas": max(lo, min(replicas, hi)),
            "target_ongoing_requests": target_ongoing_requests,
            "upscale_delay_s": 3.0, "downscale_delay_s": 30.0,
        }
    else:
        options["num_replicas"] = replicas
    if routing == "prefix":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class="specinfer.ray_serve:PrefixAffinityRouter",
            request_router_kwargs={"imbalance": imbalance},
        )
    replica = serve.deployment(SpecinferReplica, name="specinfer", **options)
    ingress = serve.deployment(Ingress, name="ingress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0})
    return ingress.bind(replica.bind(list(serve_args), specinfer_bin))


def app_from_env(args: Optional[dict] = None):
    """An application builder for a Ray Serve config file (KubeRay's RayService, `serve run`):
    the config's `args` (target, replicas, threads, serve_args) or else the environment variables
    SPECINFER_TARGET (required), SPECINFER_REPLICAS (1), SPECINFER_THREADS (1) and
    SPECINFER_SERVE_ARGS (more `specinfer serve` options, space-separated)."""
    args = args or {}

    def get(key: str, default: Optional[str] = None) -> Optional[str]:
        return str(args[key]) if key in args else os.environ.get("SPECINFER_" + key.upper(),
                                                                  default)

    target = get("target")
    if not target:
        raise RuntimeError("specinfer.ray_serve:app_from_env needs a target (SPECINFER_TARGET)")
    threads = int(get("threads", "1"))
    serve_args = ["--target", target, "--threads", str(threads)] + get("serve_args", "").split()
    return build_app(serve_args, replicas=int(get("replicas", "1")),
                     threads_per_replica=float(threads))
