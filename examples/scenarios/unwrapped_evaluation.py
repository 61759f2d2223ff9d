"""Scenario: a validation pass every 10 training steps that is not wrapped in
prof.evaluation(): 8 forward calls under torch.no_grad() on a validation DataLoader, inside the
step that follows. Its time and its loader waits are not the training loop's.
Expect: evaluation_in_steps (not dataloader_stall, not high_step_variance).
With --wrapped the pass runs in `with prof.evaluation():`, and nothing is reported."""

import argparse
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpuprof
from _common import GpuBound, args as common_args, model_and_optimizer


def parse():
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--wrapped", action="store_true")
    mine, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    return common_args(__doc__, "unwrapped-evaluation"), mine.wrapped


def validate(model, loader) -> None:
    model.eval()
    with torch.no_grad():
        for (x,) in loader:
            model(x)
    model.train()


if __name__ == "__main__":
    a, wrapped = parse()
    inner, opt = model_and_optimizer()
    model = GpuBound(inner)
    train = DataLoader(TensorDataset(torch.randn(32 * a.steps, 128)), batch_size=32)
    val = DataLoader(TensorDataset(torch.randn(8 * 32, 128)), batch_size=32)
    with gpuprof.profile(a.name, db=a.db, gpu="mock") as prof:
        for i, (x,) in enumerate(train):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if i % 10 == 4:
                if wrapped:
                    with prof.evaluation():
                        validate(model, val)
                else:
                    validate(model, val)
