"""A small CPU training run under gpuprof with kernel-trace options, for tests/test_traces.py
(run in a child interpreter: torch.profiler's native code must not take pytest down).

    python traces_train.py DB MODEL STEPS MODE OPTIONS_JSON

MODEL: mlp | attention (matmul-softmax-matmul by hand) | sdpa
(F.scaled_dot_product_attention on 4-D inputs: its fused CPU kernel) | sdpa3d (on 3-D inputs:
its unfused math fallback) | growing (an MLP whose matmul grows in the second half
of the run) | bare (no nn.Module: a parameter and a matmul); MODE: auto | manual
(prof.step(i)) | loader (auto, batches from a torch DataLoader) | eval (auto, and after each
step an evaluation in prof.evaluation() that runs torch.cumsum, which training never does).
Prints the run id as the last line.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn

import gpuprof


class Attention(nn.Module):
    """Attention-dominated: a long sequence and a small width, so bmm + softmax are most of
    the step's operator time."""

    def __init__(self, fused: bool, heads: bool) -> None:
        super().__init__()
        self.fused = fused
        self.heads = heads
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.heads:  # (batch, heads=1, seq, dim)
            q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        if self.fused:
            out = nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            w = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1)
            out = w @ v
        return out.sum(dim=-1)


class Growing(nn.Module):
    """The matmul width quadruples after `switch` forwards: its time per call grows."""

    def __init__(self, switch: int) -> None:
        super().__init__()
        self.switch = switch
        self.calls = 0
        self.small = nn.Parameter(torch.randn(64, 64) / 8)
        self.large = nn.Parameter(torch.randn(512, 512) / 23)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.switch:
            big = x.repeat(1, 8)
            return (big @ self.large @ self.large).sum(dim=-1)
        return (x @ self.small).sum(dim=-1)


def main() -> None:
    db, model_name, steps, mode, options = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                            sys.argv[4], json.loads(sys.argv[5]))
    if "trace_range" in options:
        options["trace_range"] = tuple(options["trace_range"])
    torch.manual_seed(0)
    if model_name == "mlp":
        model: nn.Module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        make = lambda: torch.randn(8, 16)  # noqa: E731
    elif model_name in ("attention", "sdpa", "sdpa3d"):
        model = Attention(fused=model_name != "attention", heads=model_name == "sdpa")
        make = lambda: torch.randn(4, 256, 16)  # noqa: E731
    elif model_name == "bare":
        w = nn.Parameter(torch.randn(32, 32) / 6)
        model = None
        make = lambda: torch.randn(8, 32)  # noqa: E731
    elif model_name == "growing":
        model = Growing(switch=steps // 2)
        make = lambda: torch.randn(64, 64)  # noqa: E731
    else:
        raise SystemExit(f"unknown model {model_name}")
    if model is None:
        params = [w]

        def forward(x: torch.Tensor) -> torch.Tensor:
            return (x @ w).relu()
    else:
        params = list(model.parameters())
        forward = model
    opt = torch.optim.SGD(params, lr=1e-3)
    batches = [make() for _ in range(steps)]
    if mode == "loader":
        batches = torch.utils.data.DataLoader(torch.stack(batches), batch_size=None)
    with gpuprof.profile(model_name, db=db, gpu="none", summary=False,
                         auto=(mode != "manual"), **options) as prof:
        for i, x in enumerate(batches):
            if mode == "manual":
                with prof.step(i):
                    forward(x).float().mean().backward()
                    opt.step()
                    opt.zero_grad()
            else:
                forward(x).float().mean().backward()
                opt.step()
                opt.zero_grad()
                if mode == "eval":
                    with prof.evaluation(), torch.no_grad():
                        forward(torch.cumsum(x, 0))
    print(prof.run_id)


if __name__ == "__main__":
    main()
