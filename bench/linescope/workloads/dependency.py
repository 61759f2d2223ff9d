"""Most of the time is inside a pure-Python dependency (`benchdep`, in bench/linescope/deps,
outside the profiled root): the user code is a thin loop around library calls."""

import benchdep

ROUNDS = 0


def main():
    total = 0
    for i in range(ROUNDS):
        words = benchdep.tokenize("the quick brown fox jumps over the lazy dog %d" % i)
        total += benchdep.checksum(words)
    return total


def scale(factor):
    global ROUNDS
    ROUNDS = max(10, int(36_000 * factor))

# ruff: noqa: UP031 - the workload keeps its %-formatting (its bytecode is what was measured)
