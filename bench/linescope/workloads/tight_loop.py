"""The tightest loop: one cheap line per iteration (`s += i % 7`)."""

N = 0


def loop(n):
    s = 0
    for i in range(n):
        s += i % 7
    return s


def main():
    return loop(N)


def scale(factor):
    global N
    N = max(1000, int(10_000_000 * factor))
