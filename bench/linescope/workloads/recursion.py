"""Deep recursion: recursive descent to depth ~900 and a recursive tree walk (many calls,
few lines each, deep frame stacks)."""

import sys

REPEATS = 0


def depth(n):
    if n == 0:
        return 0
    return 1 + depth(n - 1)


def build(d):
    if d == 0:
        return None
    return (build(d - 1), build(d - 1))


def count(node):
    if node is None:
        return 1
    left, right = node
    return count(left) + count(right)


def main():
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    total = 0
    for _ in range(REPEATS):
        total += depth(900)
    tree = build(14)
    for _ in range(max(1, REPEATS // 40)):
        total += count(tree)
    return total


def scale(factor):
    global REPEATS
    REPEATS = max(1, int(1_800 * factor))
