"""Scenario: the first step pays a one-time cost (graph capture / autotuning), simulated by a
1.5 s stall inside the first forward of a model paced at ~6 ms a step. Expect:
first_step_outlier (compilation_warmup, the softer rule, is folded under it: same cause)."""

import time

import torch
from torch import nn

import gpuprof
from _common import GpuBound, args, model_and_optimizer, train


class CompiledOnFirstCall(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.compiled = False

    def forward(self, x):
        if not self.compiled:
            time.sleep(1.5)  # what torch.compile does on the first call, in miniature
            self.compiled = True
        return self.inner(x)


if __name__ == "__main__":
    a = args(__doc__, "compile-spike")
    inner, opt = model_and_optimizer()
    model = CompiledOnFirstCall(GpuBound(inner))
    with gpuprof.profile(a.name, db=a.db, gpu="mock"):
        train(model, opt, (torch.randn(32, 128) for _ in range(a.steps)))
