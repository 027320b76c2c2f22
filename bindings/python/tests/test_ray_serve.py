"""specinfer on Ray Serve (scripts/serve-ray, specinfer.ray_serve) on a real Ray cluster of two
nodes on this machine (one CPU each, ray.cluster_utils), joined through RAY_ADDRESS: two replicas
of `specinfer serve` on the Qwen2.5-Coder 0.5B (one thread each, so one on each node) behind one
port.

  - the script prints "ready" once both replicas have loaded the model; /health says so;
  - a completion comes back with the x-specinfer-replica header and the text plain greedy
    decoding of the same model gives through the binding; streaming and the server's own errors
    come through unchanged;
  - 16 requests at once reach both replicas; the official openai client works, streaming too;
  - requests that share a long prefix go to one replica (affinity), and a conversation's next
    turn finds its start cached there;
  - a replica whose server is killed is replaced by Ray, and meanwhile every request is served;
  - `serve-ray --stop` shuts the application and the cluster down, the script exits, and no
    replica's server is left running.

Skipped, saying so, without ray (pip install 'bindings/python[ray]'), the model
(scripts/fetch-models) or the specinfer command ($SPECINFER_BIN or PATH)."""
import concurrent.futures
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import specinfer

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'bindings/python[ray]')")

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODELS = pathlib.Path(os.environ.get("SPECINFER_MODELS", pathlib.Path.home() / ".cache/specinfer/models"))
MODEL = MODELS / "qwen2.5-coder-0.5b.gguf"
BINARY = os.environ.get("SPECINFER_BIN") or shutil.which("specinfer")
PREFIX = ("# utils.py: helpers shared by the command-line tools of this project.\n"
          "import os\nimport sys\n\n\ndef read_lines(path):\n")

pytestmark = [
    pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} not found (scripts/fetch-models)"),
    pytest.mark.skipif(not BINARY, reason="no specinfer command (SPECINFER_BIN or PATH)"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body)
    conn.request(method, path, body=data, headers={"content-type": "application/json"})
    r = conn.getresponse()
    out = (r.status, r.getheader("x-specinfer-replica"), r.read().decode())
    conn.close()
    return out


@pytest.fixture(scope="module")
def nodes():
    """A head node and a second node, one CPU each."""
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c.address
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, nodes):
    port = free_port()
    env = dict(os.environ, SPECINFER_BIN=BINARY, SPECINFER_RAY_VENV=sys.prefix,
               SPECINFER_STATE_DIR=str(tmp_path_factory.mktemp("ray-state")), RAY_ADDRESS=nodes)
    script = [str(ROOT / "scripts" / "serve-ray")]
    proc = subprocess.Popen(script + ["--target", f"gguf:path={MODEL}", "--replicas", "2",
                                      "--port", str(port), "--threads", "1", "--",
                                      "--drafter", "none", "--parallel", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "ready" in line and "serve-ray" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(300):
            pytest.fail("serve-ray did not get ready in 300 s:\n" + "".join(lines[-40:]))
        yield {"port": port, "proc": proc, "env": env, "script": script, "lines": lines}
    finally:
        subprocess.run(script + ["--stop"], env=env, capture_output=True, text=True, timeout=120)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)


def servers_running():
    return subprocess.run(["pgrep", "-f", f"{BINARY} serve .*--port 0"], capture_output=True,
                          text=True).stdout.split()


def plain_greedy(prompt, n):
    reg = specinfer.Registry(1)
    target = reg.open_target("gguf", f"path={MODEL}")
    with specinfer.Session(target, None) as s:
        s.feed_text(prompt)
        return "".join(s.stream(n))


def test_replicas_serve_the_plain_text(cluster):
    port = cluster["port"]
    status, _, body = request(port, "GET", "/health")
    assert status == 200 and json.loads(body)["replicas"] == {"RUNNING": 2}, body
    status, replica, body = request(port, "POST", "/v1/completions",
                                    {"prompt": PREFIX, "max_tokens": 24, "temperature": 0})
    assert status == 200, body
    assert replica and replica.startswith("specinfer#")
    text = json.loads(body)["choices"][0]["text"]
    assert text == plain_greedy(PREFIX, 24)
    # Streaming, and the server's own answer to a malformed body.
    status, replica, body = request(port, "POST", "/v1/completions",
                                    {"prompt": "int main(", "max_tokens": 4, "stream": True})
    assert status == 200 and replica
    assert body.count("data: ") >= 2 and body.rstrip().endswith("data: [DONE]")
    status, replica, body = request(port, "POST", "/v1/completions", b"{not json")
    assert status == 400 and replica
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_concurrent_requests_reach_both_replicas_and_the_openai_client(cluster):
    """16 requests at once are spread over both replicas; the official openai client gets the
    same text whole and streamed."""
    port = cluster["port"]
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(lambda i: request(port, "POST", "/v1/completions",
                                                {"prompt": f"def f{i}(x):", "max_tokens": 8}),
                              range(16)))
    assert all(status == 200 for status, _, _ in results), results
    assert len({replica for _, replica, _ in results}) == 2, results
    openai = pytest.importorskip("openai", reason="the openai package is not installed")
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                      timeout=120)
    r = c.completions.create(model="qwen2.5-coder-0.5b", prompt=PREFIX, max_tokens=12,
                             temperature=0)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="qwen2.5-coder-0.5b", prompt=PREFIX, max_tokens=12, temperature=0, stream=True)
        if ch.choices)
    assert streamed == r.choices[0].text == plain_greedy(PREFIX, 12)


def test_shared_prefix_goes_to_one_replica(cluster):
    port = cluster["port"]
    seen = set()
    for i in range(4):
        status, replica, body = request(port, "POST", "/v1/completions",
                                        {"prompt": PREFIX + f"    # variant {i}\n",
                                         "max_tokens": 4})
        assert status == 200, body
        seen.add(replica)
    assert len(seen) == 1, seen
    # A conversation's next turn: the same replica, which scores only what the turn added.
    prompt = PREFIX * 3
    status, first, body = request(port, "POST", "/v1/completions",
                                  {"prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    answer = json.loads(body)
    prompt += answer["choices"][0]["text"] + "\n# next\n"
    status, replica, body = request(port, "POST", "/v1/completions",
                                    {"prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert status == 200 and replica == first, (replica, first, body)
    usage = json.loads(body)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= answer["usage"]["prompt_tokens"], usage


def test_a_dead_replica_is_replaced_and_others_serve(cluster):
    port = cluster["port"]
    servers = servers_running()
    assert len(servers) == 2, servers
    os.kill(int(servers[0]), signal.SIGKILL)
    for i in range(6):  # served by the other replica (or a request retried there)
        status, replica, body = request(port, "POST", "/v1/completions",
                                        {"prompt": f"value_{i} = ", "max_tokens": 3})
        assert status == 200, body
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, _, body = request(port, "GET", "/health")
        now = servers_running()
        if status == 200 and json.loads(body)["status"] == "ok" and len(now) == 2 \
                and servers[0] not in now:
            break
        time.sleep(1)
    else:
        pytest.fail(f"the killed replica was not replaced in 120 s: {body}")


def test_stop_ends_the_application(cluster):
    env, script, proc = cluster["env"], cluster["script"], cluster["proc"]
    out = subprocess.run(script + ["--stop"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert proc.wait(60) == 0
    with pytest.raises(OSError):
        request(cluster["port"], "GET", "/health", timeout=5)
    # No replica's server outlives it (the killed replica's included).
    deadline = time.monotonic() + 30
    while servers_running() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not servers_running()
