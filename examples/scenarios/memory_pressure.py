"""Scenario: device memory nearly full (mock GPU ramps to 95% of 80 GiB).
Expect: memory_pressure."""

import time

import torch

import gpuprof
from _common import args, model_and_optimizer, train


def batches(n: int):
    for _ in range(n):
        time.sleep(0.005)
        yield torch.randn(32, 128)


if __name__ == "__main__":
    a = args(__doc__, "memory-pressure")
    model, opt = model_and_optimizer()
    with gpuprof.profile(a.name, db=a.db, gpu="mock",
                         mock_scenario="mem_frac=0.95,mem_start_frac=0.9,mem_ramp_s=0.2"):
        train(model, opt, batches(a.steps))
