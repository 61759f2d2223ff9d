"""Scenario: the loader cannot keep up (20 ms per batch, 1-2 ms of compute).
Expect: [HIGH] dataloader_stall."""

import time

import torch

import gpuprof
from _common import args, model_and_optimizer, train


def batches(n: int):
    for _ in range(n):
        time.sleep(0.02)  # decoding / reading on the training thread
        yield torch.randn(32, 128)


if __name__ == "__main__":
    a = args(__doc__, "slow-dataloader")
    model, opt = model_and_optimizer()
    with gpuprof.profile(a.name, db=a.db, gpu="mock"):
        train(model, opt, batches(a.steps))
