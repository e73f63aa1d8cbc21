"""Latency of a normal request while 10 MB request bodies arrive (loopback only).

    python gpu_runs/big_bodies.py [--target <dir|.gguf>] [--seconds 20] --out bench/big_bodies

Starts `specheads serve --method ar` in a subprocess twice: with the default body limit (a 10 MB
body is a 413 before it is read) and with --max-request-bytes 16 MiB (each 10 MB chat body is
templated and tokenized, off the event loop). In each, a client sends normal requests (a short
chat, 8 new tokens) one after another, first alone, then while 3 other clients send 10 MB chat
bodies back to back. Prints p50/p99 latency of the normal requests and of GET /health in each
phase, and the big bodies' status codes; writes <out>.json. Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from serve_load import percentile  # noqa: E402


def start_server(target, port: int, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "specheads.cli", "serve", "--method", "ar", "--port", str(port),
           "--served-model-name", "m", "--max-len", "512"] + (["--target", target] if target else []) + extra
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the server did not come up")


def phase(url: str, seconds: float, big_clients: int) -> dict:
    normal = {"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * 2_000_000}],
                      "max_tokens": 4}).encode()
    stop = threading.Event()
    big_codes: list[int] = []

    def flood():
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                try:
                    big_codes.append(c.post(url + "/v1/chat/completions", content=big,
                                            headers={"Content-Type": "application/json"}).status_code)
                except httpx.HTTPError as e:
                    big_codes.append(type(e).__name__)

    threads = [threading.Thread(target=flood) for _ in range(big_clients)]
    for t in threads:
        t.start()
    lat, health = [], []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=120) as c:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            r = c.post(url + "/v1/chat/completions", json=normal)
            lat.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            t0 = time.perf_counter()
            c.get(url + "/health")
            health.append(time.perf_counter() - t0)
    stop.set()
    for t in threads:
        t.join(300)
    codes: dict = {}
    for code in big_codes:
        codes[str(code)] = codes.get(str(code), 0) + 1
    return {"big_clients": big_clients, "normal_requests": len(lat), "p50_s": percentile(lat, 50),
            "p99_s": percentile(lat, 99), "health_p50_s": percentile(health, 50), "health_p99_s": percentile(health, 99),
            "big_body_status": codes, "big_body_mb": len(big) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--out", default="bench/big_bodies")
    args = ap.parse_args()
    rows = []
    for label, extra in (("default limit (4 MiB)", []), ("--max-request-bytes 16 MiB", ["--max-request-bytes",
                                                                                           str(16 * 2**20)])):
        proc = start_server(args.target, args.port, extra)
        try:
            url = f"http://127.0.0.1:{args.port}"
            for n in (0, 3):
                row = {"server": label, **phase(url, args.seconds, n)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "cpu_cores": os.cpu_count(), "rows": rows}, indent=1))
    print(f"{'server':>28} {'big clients':>11} {'normal p50':>10} {'p99':>7} {'health p50':>10} {'p99':>7}  big bodies")
    for r in rows:
        print(f"{r['server']:>28} {r['big_clients']:>11} {r['p50_s']:>10.3f} {r['p99_s']:>7.3f} "
              f"{r['health_p50_s']:>10.3f} {r['health_p99_s']:>7.3f}  {r['big_body_status']}")


if __name__ == "__main__":
    main()
