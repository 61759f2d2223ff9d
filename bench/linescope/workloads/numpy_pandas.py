"""A script that calls numpy and pandas: small-array numpy arithmetic in a Python loop and a
pandas groupby/merge pipeline. Most time is in C extensions and in pandas' own Python code
(site-packages, outside the root)."""

import numpy as np
import pandas as pd

ROUNDS = 0


def features(x):
    y = np.sqrt(np.abs(x)) + 0.5 * x
    return float(y.mean()), float(np.percentile(y, 90))


def frame_stats(df):
    g = df.groupby("key")["value"].agg(["mean", "sum", "count"])
    joined = df.merge(g, left_on="key", right_index=True)
    return float(joined["mean"].sum())


def main():
    rng = np.random.default_rng(7)
    total = 0.0
    for _ in range(ROUNDS):
        x = rng.standard_normal(64)
        m, p = features(x)
        total += m + p
    df = pd.DataFrame({"key": rng.integers(0, 50, 5_000), "value": rng.standard_normal(5_000)})
    for _ in range(max(1, ROUNDS // 20)):
        total += frame_stats(df)
    return total


def scale(factor):
    global ROUNDS
    ROUNDS = max(20, int(3_000 * factor))


def setup():
    # pandas initialises groupby/merge machinery lazily on first use (~2 s); pay that before
    # the timed region so that every variant measures the same steady-state work.
    rng = np.random.default_rng(0)
    frame_stats(pd.DataFrame({"key": rng.integers(0, 5, 50), "value": rng.standard_normal(50)}))
    features(rng.standard_normal(8))
