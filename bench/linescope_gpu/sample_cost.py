"""Cost of one linescope sample on the main thread: the native handler (stack walk,
attribution, optional RSS read) called directly, and a signal round trip to a Python handler.

    .venv/bin/python bench/linescope_gpu/sample_cost.py
"""
import os, time, signal
from gpuprof import _native
def deep(n, f):
    if n: return deep(n - 1, f)
    return f()
def bench(attribute, memory, depth):
    s = _native.LineSampler([os.getcwd()], [], [], os.getcwd(), interval_ns=10**9, attribute=attribute, memory=memory, gpu_backend="off")
    sig = signal.SIGURG
    old = signal.signal(sig, s.on_signal)
    s.start(sig)
    def loop():
        t0 = time.perf_counter()
        for _ in range(20000): s.on_signal()
        return time.perf_counter() - t0
    dt = deep(depth, loop)
    s.stop(); signal.signal(sig, old)
    t0 = time.perf_counter()
    for _ in range(20000): pass
    base = time.perf_counter() - t0
    return (dt - base) / 20000 * 1e9
for depth in (1, 30):
    for attr, mem in ((True, False), (True, True)):
        print(f"depth {depth} attribute={attr} memory={mem}: {bench(attr, mem, depth):.0f} ns per sample")
# signal round trip cost
s = _native.LineSampler([os.getcwd()], [], [], os.getcwd(), interval_ns=10**9, attribute=True, memory=False, gpu_backend="off")
n = [0]
def h(*a): n[0] += 1
old = signal.signal(signal.SIGURG, h)
t0 = time.perf_counter()
for _ in range(20000): os.kill(os.getpid(), signal.SIGURG)
dt = time.perf_counter() - t0
signal.signal(signal.SIGURG, old)
print(f"signal + python handler round trip ~{dt / 20000 * 1e9:.0f} ns ({n[0]} delivered)")
