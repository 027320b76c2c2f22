"""`scripts/serve-ray`: specinfer replicas on a Ray cluster behind one OpenAI-compatible port.

    python -m specinfer.ray_cli --target gguf:path=MODEL.gguf [--drafter SPEC] --replicas N \
        --port PORT [--min-replicas A --max-replicas B] [-- more `specinfer serve` options]
    python -m specinfer.ray_cli --stop

Without RAY_ADDRESS a local cluster is started (`ray start --head`) and remembered in a state
file, so that `--stop` shuts the application down and stops that cluster too; with RAY_ADDRESS
the application joins the cluster it names and `--stop` leaves the cluster running. Prints one
line containing "ready" once every replica has loaded its model, then serves until interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path



def _state_file() -> Path:
    base = Path(os.environ.get("SPECINFER_STATE_DIR")
                or Path.home() / ".cache" / "specinfer")
    return base / "serve-ray.json"


def _ray_command() -> list:
    # The `ray` CLI of this Python environment (a venv's bin/ need not be on PATH).
    return [sys.executable, "-m", "ray.scripts.scripts"]


def _start_cluster(num_cpus: int) -> str:
    cmd = _ray_command() + ["start", "--head", "--disable-usage-stats",
                            f"--num-cpus={num_cpus}", "--include-dashboard=false"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("serve-ray: `ray start --head` failed:\n" + out.stdout + out.stderr)
    return "auto"


def _stop_cluster() -> None:
    subprocess.run(_ray_command() + ["stop"], capture_output=True, text=True)


def _forget(state: dict, path: Path) -> None:
    """Stops the cluster if serve-ray started it, and drops the state file."""
    if state.get("started_cluster"):
        _stop_cluster()
    path.unlink(missing_ok=True)


def stop() -> int:
    import ray
    from ray import serve

    state = {}
    path = _state_file()
    if path.exists():
        try:
            state = json.loads(path.read_text())
        except ValueError:
            state = {}
    address = os.environ.get("RAY_ADDRESS") or state.get("address")
    if address:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            serve.shutdown()
            ray.shutdown()
        except Exception as e:  # no cluster there any more: nothing to shut down
            print(f"serve-ray: {e}", file=sys.stderr)
    _forget(state, path)
    print("serve-ray: stopped", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="serve-ray", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="the model, e.g. gguf:path=model.gguf (as specinfer serve)")
    p.add_argument("--drafter", action="append", default=[],
                   help="drafter spec for specinfer serve (repeatable; default: its auto)")
    p.add_argument("--replicas", type=int, default=1, help="replicas (initial ones when scaling)")
    p.add_argument("--min-replicas", type=int, help="scale on load between these bounds")
    p.add_argument("--max-replicas", type=int)
    p.add_argument("--target-ongoing", type=float, default=4.0,
                   help="requests in flight per replica that autoscaling aims at")
    p.add_argument("--threads", type=int, default=0,
                   help="backend threads per replica (0: the cores divided among the replicas)")
    p.add_argument("--host", default="127.0.0.1", help="address the ingress listens on")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--routing", choices=("prefix", "round-robin"), default="prefix",
                   help="prefix: a shared prefix goes to the replica that holds it")
    p.add_argument("--specinfer", help="the specinfer command (default: SPECINFER_BIN or PATH)")
    p.add_argument("--stop", action="store_true", help="shut the application (and a cluster "
                   "serve-ray started) down")
    p.add_argument("serve_args", nargs="*", help="after --: more `specinfer serve` options")
    a = p.parse_args(argv)
    if a.stop:
        return stop()
    if not a.target:
        p.error("--target is required (or --stop)")
    if a.replicas < 1:
        p.error("--replicas must be at least 1")

    import ray
    from ray import serve
    from specinfer.ray_serve import APP_NAME, build_app

    cores = os.cpu_count() or 1
    most = max(a.replicas, a.max_replicas or 0)
    threads = a.threads or max(1, cores // most)
    serve_args = ["--target", a.target, "--threads", str(threads)]
    for d in a.drafter:
        serve_args += ["--drafter", d]
    serve_args += a.serve_args

    state = {"started_cluster": False}
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        address = _start_cluster(num_cpus=cores)
        state["started_cluster"] = True
    state["address"] = address
    path = _state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state))

    # The replicas find the command, library and plugins as this process does.
    env = {k: v for k, v in os.environ.items()
           if k in ("SPECINFER_BIN", "SPECINFER_LIBRARY", "SPECINFER_PLUGIN_PATH")}
    ray.init(address=address, logging_level="ERROR", runtime_env={"env_vars": env})
    serve.start(http_options={"host": a.host, "port": a.port})
    app = build_app(serve_args, replicas=a.replicas, min_replicas=a.min_replicas,
                    max_replicas=a.max_replicas, target_ongoing_requests=a.target_ongoing,
                    routing=a.routing, specinfer_bin=a.specinfer,
                    threads_per_replica=min(float(threads), float(cores)))
    t0 = time.monotonic()
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)  # returns once all are up
    states = serve.status().applications[APP_NAME].deployments["specinfer"].replica_states
    n = int(states.get("RUNNING", 0))
    print(f"serve-ray: ready: {n} replica(s) of {a.target} on http://{a.host}:{a.port} "
          f"({time.monotonic() - t0:.1f} s)", flush=True)

    stopping = {"now": False}

    def on_signal(signum, frame):
        stopping["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # Serves until interrupted, or until `serve-ray --stop` (from anywhere) removes the app.
    last_check = time.monotonic()
    while not stopping["now"]:
        time.sleep(0.5)
        if time.monotonic() - last_check >= 2.0:
            last_check = time.monotonic()
            try:
                if APP_NAME not in serve.status().applications:
                    print("serve-ray: the application was shut down", flush=True)
                    return 0
            except Exception:  # the cluster is gone (ray stop)
                print("serve-ray: the cluster stopped", flush=True)
                return 0
    print("serve-ray: stopping", flush=True)
    serve.shutdown()
    ray.shutdown()
    _forget(state, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
