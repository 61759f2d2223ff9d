"""Shared pieces of the scenario examples: a small MLP, a loop, argument parsing."""

from __future__ import annotations

import argparse
import time
from typing import Iterable

import torch
from torch import nn


def args(description: str, name: str):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--db", default="gpuprof.db")
    p.add_argument("--name", default=name)
    p.add_argument("--steps", type=int, default=40)
    return p.parse_args()


def model_and_optimizer(width: int = 128, depth: int = 3):
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


class GpuBound(nn.Module):
    """The model with 20 ms of 'GPU work' (a sleep) per forward: the loop is paced by compute, not by
    its input (a sleep between batches would be a loader stall). 20 ms, not less: a shared machine's
    scheduling hiccups (10-15 ms on a loaded 2-core VM) must not double a step, or the run shows a
    step-time variance the scenario does not have."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        time.sleep(0.020)
        return self.inner(x)


def train(model: nn.Module, opt: torch.optim.Optimizer, batches: Iterable) -> None:
    for x in batches:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
