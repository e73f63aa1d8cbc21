"""Load test of `specheads serve`: 1, 8 and 32 concurrent streaming clients, speculation on
and off, on loopback only.

    python scripts/serve_load.py --target <dir|.gguf> --draft runs/smollm2-eagle3/final --out bench/serve
    python scripts/serve_load.py --url http://127.0.0.1:8000 --model NAME --out bench/serve

Without --url it starts `specheads serve` in a subprocess (clients and server in one process
would share the interpreter lock) with the head (eagle3) and, for the "ar" row, a second
server with --method ar on the same target. Modes: `spec` (server default), `off` (per-request
`"speculation": {"enabled": false}`: plain decoding inside the speculative engine's batch),
`ar` (a server without a drafter). Each cell runs at most --requests requests and
--max-seconds seconds, after a warm-up of the same concurrency. Prints a table (requests/s,
output tokens/s, p50/p99 latency, TTFT p50, mean acceptance length, and the share of answers
identical to the `ar` server's answer to the same prompt with one client: greedy speculation is
lossless only if that is 100%), writes <out>.json and <out>.png. Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

import httpx

from specheads.runtime.defaults import DEFAULT_TREE

sys.path.insert(0, str(Path(__file__).resolve().parent))


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


async def one_request(client: httpx.AsyncClient, body: dict) -> dict:
    t0 = time.perf_counter()
    ttft, last, text = None, None, []
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"{r.status_code} {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": chunk["error"]["message"]}
            content = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if content:
                text.append(content)
                if ttft is None:
                    ttft = time.perf_counter() - t0
            last = chunk
    spec = last.get("speculation", {})
    return {"latency": time.perf_counter() - t0, "ttft": ttft if ttft is not None else time.perf_counter() - t0,
            "tokens": last["usage"]["completion_tokens"], "steps": spec.get("steps", 0),
            "accepted": spec.get("accepted_tokens", 0), "text": "".join(text)}


async def run_cell(url: str, headers: dict, model: str, prompts: list[str], clients: int, requests: int,
                   max_seconds: float, max_tokens: int, speculation: dict | None) -> dict:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        def body(i: int) -> dict:
            b = {"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                 "max_tokens": max_tokens, "temperature": 0, "stream": True}
            if speculation is not None:
                b["speculation"] = speculation
            return b

        # warm-up: the same concurrency, short answers (CUDA graphs of these batch sizes get captured)
        await asyncio.gather(*[one_request(client, {**body(i), "max_tokens": 16}) for i in range(clients)])
        results, issued = [], 0
        t0 = time.perf_counter()
        deadline = t0 + max_seconds

        async def worker():
            nonlocal issued
            while issued < requests and time.perf_counter() < deadline:
                i = issued
                issued += 1
                results.append({**await one_request(client, body(i)), "prompt": i % len(prompts)})

        await asyncio.gather(*[worker() for _ in range(clients)])
        wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    tokens = sum(r["tokens"] for r in ok)
    steps = sum(r["steps"] for r in ok)
    return {
        "clients": clients, "requests": len(ok), "errors": [r["error"] for r in results if "error" in r][:5],
        "wall_s": round(wall, 3), "requests_per_s": round(len(ok) / wall, 3), "output_tokens_per_s": round(tokens / wall, 1),
        "latency_p50_s": round(percentile([r["latency"] for r in ok], 50), 4),
        "latency_p99_s": round(percentile([r["latency"] for r in ok], 99), 4),
        "ttft_p50_s": round(percentile([r["ttft"] for r in ok], 50), 4),
        "mean_acceptance_length": round(1 + sum(r["accepted"] for r in ok) / steps, 3) if steps else None,
        "answers": {r["prompt"]: r["text"] for r in ok},  # compared with the ar server's, then dropped
    }


@contextlib.contextmanager
def server_process(args, method: str):
    """`specheads serve` in its own process on a free loopback port (clients in this process
    would share its interpreter lock, and at 8-32 streaming clients the load generator itself
    skews the server's numbers); stopped with SIGTERM (its graceful shutdown) at the end."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "specheads.cli", "serve", "--port", str(port), "--served-model-name", "target",
           "--method", method, "--num-steps", str(args.num_steps), "--topk", str(args.topk),
           "--num-draft-tokens", str(args.num_draft_tokens), "--max-batch", str(args.max_batch),
           "--max-len", str(args.max_len), "--max-queue", "1024", "--request-timeout", "3600"]
    if args.target:
        cmd += ["--target", args.target]
    if method == "eagle3":
        cmd += ["--draft", args.draft]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 900
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before it was ready: {' '.join(cmd)}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the server did not become ready in 900 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=None, help="a running server (loopback); default: start one (a subprocess)")
    ap.add_argument("--model", default="target", help="with --url: the served model name")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--num-steps", type=int, default=DEFAULT_TREE[0])
    ap.add_argument("--topk", type=int, default=DEFAULT_TREE[1])
    ap.add_argument("--num-draft-tokens", type=int, default=DEFAULT_TREE[2])
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--modes", nargs="+", default=["spec", "off", "ar"], choices=["spec", "off", "ar"])
    ap.add_argument("--requests", type=int, default=64, help="per cell, at most")
    ap.add_argument("--max-seconds", type=float, default=60, help="per cell, at most (then no new requests)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=64, help="ShareGPT held-out first turns")
    ap.add_argument("--prompt-file", default=None,
                    help="a JSON list of prompt texts instead of reading ShareGPT (e.g. .dev/prompts/sharegpt.json)")
    ap.add_argument("--out", default="bench/serve_load")
    args = ap.parse_args()
    if args.url and not args.url.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")):
        ap.error("--url must be a loopback address")

    if args.prompt_file:
        prompts = json.loads(Path(args.prompt_file).read_text())[: args.prompts]
    else:
        from bench import sharegpt_prompts

        prompts = sharegpt_prompts(args.prompts)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    rows = []

    def cells(url: str, model: str, mode: str):
        spec = {"enabled": False} if mode == "off" else None
        for c in args.clients:
            r = asyncio.run(run_cell(url, headers, model, prompts, c, max(args.requests, c), args.max_seconds,
                                     args.max_tokens, spec))
            r["mode"] = mode
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "answers"}), flush=True)

    if args.url:
        for mode in [m for m in args.modes if m != "ar"]:
            cells(args.url, args.model, mode)
    else:
        if {"spec", "off"} & set(args.modes):
            with server_process(args, "eagle3") as url:
                for mode in [m for m in args.modes if m != "ar"]:
                    cells(url, "target", mode)
        if "ar" in args.modes:
            with server_process(args, "ar") as url:
                cells(url, "target", "ar")
    identical_answers(rows)
    report_table(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows, "speedup": speedups(rows)},
                                                   indent=1))
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


def identical_answers(rows: list[dict]) -> None:
    """Each cell's share of answers equal to the ar server's with one client for the same prompt
    (None without that cell); the answers themselves are dropped from the rows."""
    ref = next((r["answers"] for r in rows if r["mode"] == "ar" and r["clients"] == 1), None)
    for r in rows:
        answers = r.pop("answers")
        common = [i for i in answers if ref is not None and i in ref]
        r["identical_to_ar1"] = round(sum(answers[i] == ref[i] for i in common) / len(common), 4) if common else None


def speedups(rows: list[dict]) -> dict:
    """Output tokens/s of speculation over each baseline, per client count."""
    by = {(r["mode"], r["clients"]): r["output_tokens_per_s"] for r in rows}
    out = {}
    for (mode, c), tps in by.items():
        if mode != "spec":
            continue
        for base in ("off", "ar"):
            if by.get((base, c)):
                out[f"spec/{base}@{c}"] = round(tps / by[(base, c)], 3)
    return out


def report_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="specheads serve: streaming chat clients on loopback")
    for col in ("mode", "clients", "requests", "req/s", "out tok/s", "p50 s", "p99 s", "TTFT p50 s", "accept len",
                "= ar@1", "errors"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["mode"], str(r["clients"]), str(r["requests"]), f"{r['requests_per_s']:.2f}",
                  f"{r['output_tokens_per_s']:.0f}", f"{r['latency_p50_s']:.3f}", f"{r['latency_p99_s']:.3f}",
                  f"{r['ttft_p50_s']:.3f}", str(r["mean_acceptance_length"] or "-"),
                  "-" if r["identical_to_ar1"] is None else f"{r['identical_to_ar1']:.0%}", str(len(r["errors"])))
    console = Console(width=150)
    console.print(t)
    for k, v in speedups(rows).items():
        console.print(f"output tokens/s {k}: {v}x")


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = [r for r in rows if r["mode"] == mode]
        axes[0].plot([r["clients"] for r in rs], [r["output_tokens_per_s"] for r in rs], marker="o", label=mode)
        axes[1].plot([r["clients"] for r in rs], [r["latency_p50_s"] for r in rs], marker="o", label=mode)
    for ax, label in zip(axes, ("output tokens/s", "p50 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
