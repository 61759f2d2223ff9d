"""Scenario: a GPU running hot and clocking down (mock GPU: 88 °C, SM clock 1980 -> 1200 MHz
with thermal clock-event reasons). Expect: thermal_throttling."""

import torch

import gpuprof
from _common import GpuBound, args, model_and_optimizer, train


if __name__ == "__main__":
    a = args(__doc__, "throttling-gpu")
    inner, opt = model_and_optimizer()
    model = GpuBound(inner)
    scenario = "temp=88,idle_temp=86,throttle=1,throttle_clock_mhz=1200,throttle_reason=thermal"
    with gpuprof.profile(a.name, db=a.db, gpu="mock", mock_scenario=scenario):
        train(model, opt, (torch.randn(32, 128) for _ in range(a.steps)))
