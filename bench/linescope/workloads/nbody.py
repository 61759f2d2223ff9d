"""nbody-like: a 5-body gravity simulation on plain lists (arithmetic-heavy loop body)."""

import math

STEPS = 0

PI = math.pi
SOLAR_MASS = 4 * PI * PI
DAYS = 365.24


def bodies():
    return [
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], SOLAR_MASS],
        [[4.84, -1.16, -0.10], [0.606 * DAYS, 2.81 * DAYS, -0.02 * DAYS], 0.000954 * SOLAR_MASS],
        [[8.34, 4.12, -0.40], [-1.01 * DAYS, 1.82 * DAYS, 0.008 * DAYS], 0.000285 * SOLAR_MASS],
        [[12.89, -15.11, -0.22], [1.08 * DAYS, 0.868 * DAYS, -0.01 * DAYS], 0.0000436 * SOLAR_MASS],
        [[15.37, -25.91, 0.17], [0.979 * DAYS, 0.594 * DAYS, -0.034 * DAYS], 0.0000515 * SOLAR_MASS],  # noqa: E501
    ]


def advance(system, pairs, dt, n):
    for _ in range(n):
        for (r1, v1, m1), (r2, v2, m2) in pairs:
            dx = r1[0] - r2[0]
            dy = r1[1] - r2[1]
            dz = r1[2] - r2[2]
            mag = dt * ((dx * dx + dy * dy + dz * dz) ** -1.5)
            b1 = m1 * mag
            b2 = m2 * mag
            v1[0] -= dx * b2
            v1[1] -= dy * b2
            v1[2] -= dz * b2
            v2[0] += dx * b1
            v2[1] += dy * b1
            v2[2] += dz * b1
        for r, v, _m in system:
            r[0] += dt * v[0]
            r[1] += dt * v[1]
            r[2] += dt * v[2]


def energy(system, pairs):
    e = 0.0
    for (r1, _v1, m1), (r2, _v2, m2) in pairs:
        dx = r1[0] - r2[0]
        dy = r1[1] - r2[1]
        dz = r1[2] - r2[2]
        e -= (m1 * m2) / ((dx * dx + dy * dy + dz * dz) ** 0.5)
    for _r, v, m in system:
        e += m * (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]) / 2.0
    return e


def main():
    system = bodies()
    pairs = [(system[i], system[j]) for i in range(len(system)) for j in range(i + 1, len(system))]
    before = energy(system, pairs)
    advance(system, pairs, 0.01, STEPS)
    return before, energy(system, pairs)


def scale(factor):
    global STEPS
    STEPS = max(10, int(60_000 * factor))
