"""Timing one op on the GPU for the kernel sweeps (kernel_bench.py, linear_check.py,
verify_kernels.py): microseconds a call, launch gaps hidden as a step's CUDA graph hides them."""
from __future__ import annotations

import torch


def graph_us(fn, calls: int = 20, replays: int = 10) -> float:
    """fn run 3 times on a side stream (compiles, allocates), then `calls` calls captured in one
    CUDA graph, replayed once to warm up and `replays` times between two events: us a call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (calls * replays)
