"""The device n-gram lookup's kernel of an older commit beside the current one, on the GPU: each
captured in a CUDA graph and replayed (timing.graph_us) at the engine's shapes (batch 1, 8 and 64; context
buckets of 256, 1,024 and 4,096 tokens; chains of 15 and 31; max_ngram 4, and 6 and 8 for the current
one), with whether their outputs agree. Prints a table, writes DIR/ngram_old_new.json.

    python3 gpu_runs/ngram_old_new.py --old COMMIT --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from older import module_at  # noqa: E402
from timing import graph_us  # noqa: E402

from specheads.kernels import ngram as new  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="the older commit")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    old = module_at(args.old, "specheads/kernels/ngram.py", "ngram_old", (("_ngram_kernel", "_ngram_kernel_old"),))
    dev = torch.device("cuda")
    rows = []
    print(f"{'batch':>5} {'context':>7} {'chain':>5} {'max':>3} {'old us':>7} {'new us':>7} {'same':>5}")
    for b in (1, 8, 64):
        for w in (256, 1024, 4096):
            for n in (15, 31):
                g = torch.Generator().manual_seed(b * w + n)
                h = torch.randint(0, 40, (b, w + 1), generator=g).to(dev)
                length = torch.randint(w // 2, w, (b,), generator=g).to(dev)
                roots = torch.randint(0, 40, (b,), generator=g).to(dev)
                cols = torch.arange(n, device=dev)
                for max_ngram in (4, 6, 8):
                    got = new.ngram_lookup(h, length, roots, cols, max_ngram, 3)
                    new_us = graph_us(lambda: new.ngram_lookup(h, length, roots, cols, max_ngram, 3))
                    old_us, same = None, None
                    if max_ngram <= old.KERNEL_MAX_NGRAM:
                        want = old.ngram_lookup(h, length, roots, cols, max_ngram, 3)
                        same = bool(torch.equal(got[1], want[1]) and torch.equal(got[0][got[1]], want[0][want[1]]))
                        old_us = graph_us(lambda: old.ngram_lookup(h, length, roots, cols, max_ngram, 3))
                    rows.append({"batch": b, "context": w, "chain": n, "max_ngram": max_ngram, "old_us": old_us,
                                 "new_us": new_us, "same": same})
                    print(f"{b:5d} {w:7d} {n:5d} {max_ngram:3d} {old_us if old_us is not None else float('nan'):7.2f} "
                          f"{new_us:7.2f} {str(same):>5}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ngram_old_new.json").write_text(json.dumps({"card": torch.cuda.get_device_name(), "old": args.old,
                                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
