"""Scenario: device memory nearly full (mock GPU ramps to 95% of 80 GiB).
Expect: memory_pressure."""

import torch

import gpuprof
from _common import GpuBound, args, model_and_optimizer, train


if __name__ == "__main__":
    a = args(__doc__, "memory-pressure")
    inner, opt = model_and_optimizer()
    model = GpuBound(inner)
    with gpuprof.profile(a.name, db=a.db, gpu="mock",
                         mock_scenario="mem_frac=0.95,mem_start_frac=0.9,mem_ramp_s=0.2"):
        train(model, opt, (torch.randn(32, 128) for _ in range(a.steps)))
