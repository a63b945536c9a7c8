#!/usr/bin/env python3
"""Lock cycles per second (acquire + release) of the Python client beside
redis-py doing a fenced Redis lock (a Lua script, the recipe of bench/redis.go),
with 1 and 50 concurrent callers, against one local node each. A benchmark,
not a test.

    /usr/bin/python3 clients/python/bench.py [--duration 5] [--rounds 3] [--kuncid bin/kuncid]

redis-py is Debian's python3-redis (for /usr/bin/python3); redis-server must be
on PATH. Each caller cycles a key of its own (uncontended); rounds are
interleaved and the table gives each case's median, with the range. --profile
runs the 50-caller thread case under cProfile (the caller threads and the I/O
thread) and prints the functions that took the most time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Awaitable, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kunci  # noqa: E402

ACQUIRE = """if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0"""
RELEASE = """if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_kuncid(binary: str) -> tuple[subprocess.Popen[bytes], str]:
    p = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--data-dir", "", "--log-format", "json"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert p.stderr is not None
    for raw in p.stderr:
        line = json.loads(raw)
        if line.get("message") == "kunci node started":
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()  # type: ignore[union-attr]
            return p, str(line["addr"])
    raise SystemExit("kuncid did not start")


def start_redis() -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    p = subprocess.Popen(argv,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def run_threads(n: int, duration: float, cycle: Callable[[int], None]) -> float:
    """n threads call cycle(caller) until duration passes; cycles/s."""
    stop = threading.Event()
    counts = [0] * n

    def loop(g: int) -> None:
        c = 0
        while not stop.is_set():
            cycle(g)
            c += 1
        counts[g] = c

    ts = [threading.Thread(target=loop, args=(g,)) for g in range(n)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    time.sleep(duration)
    stop.set()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


async def run_tasks(n: int, duration: float, cycle: Callable[[int], Awaitable[None]]) -> float:
    """n tasks await cycle(caller) until duration passes; cycles/s."""
    stop = False
    counts = [0] * n

    async def loop(g: int) -> None:
        while not stop:
            await cycle(g)
            counts[g] += 1

    start = time.perf_counter()
    tasks = [asyncio.ensure_future(loop(g)) for g in range(n)]
    await asyncio.sleep(duration)
    stop = True
    await asyncio.gather(*tasks)
    return sum(counts) / (time.perf_counter() - start)


def kunci_threads(addr: str, n: int, duration: float) -> float:
    with kunci.Client([addr]) as c:
        def cycle(g: int) -> None:
            c.acquire("bench/%d" % g, lease=30, wait=5).release()
        return run_threads(n, duration, cycle)


def kunci_async(addr: str, n: int, duration: float) -> float:
    async def main() -> float:
        async with kunci.AsyncClient([addr]) as c:
            async def cycle(g: int) -> None:
                lock = await c.acquire("bench/%d" % g, lease=30, wait=5)
                await lock.release()

            return await run_tasks(n, duration, cycle)

    return asyncio.run(main())


def redis_threads(port: int, n: int, duration: float) -> float:
    import redis  # type: ignore[import]

    r = redis.Redis(host="127.0.0.1", port=port, connection_pool=redis.BlockingConnectionPool(
        host="127.0.0.1", port=port, max_connections=n))
    acquire, release = r.register_script(ACQUIRE), r.register_script(RELEASE)

    def cycle(g: int) -> None:
        key, val = "bench/%d" % g, uuid.uuid4().hex
        if not acquire(keys=[key, "bench/fence"], args=[val, 30000]):
            raise RuntimeError("redis lock held")
        release(keys=[key], args=[val])

    try:
        return run_threads(n, duration, cycle)
    finally:
        r.close()


def redis_async(port: int, n: int, duration: float) -> float:
    import redis.asyncio as aredis  # type: ignore[import]

    async def main() -> float:
        r = aredis.Redis(connection_pool=aredis.BlockingConnectionPool(host="127.0.0.1", port=port, max_connections=n))
        acquire, release = r.register_script(ACQUIRE), r.register_script(RELEASE)

        async def cycle(g: int) -> None:
            key, val = "bench/%d" % g, uuid.uuid4().hex
            if not await acquire(keys=[key, "bench/fence"], args=[val, 30000]):
                raise RuntimeError("redis lock held")
            await release(keys=[key], args=[val])

        rate = await run_tasks(n, duration, cycle)
        await r.aclose() if hasattr(r, "aclose") else await r.close()
        return rate

    return asyncio.run(main())


def clientlib_case(bench_bin: str, addr: str, n: int, duration: float) -> float:
    """clientlib (Go) on the same node: the load generator's client mode,
    n goroutines over one address (two connections, as the Python clients)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([bench_bin, "--target", "kunci://" + addr, "--mode", "client", "--conns", "1", "--depth", str(n),
                        "--duration", f"{duration}s", "--progress", "0", "--json", f.name],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return float(json.load(open(f.name))["cycles_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per case and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--callers", default="1,50")
    ap.add_argument("--kuncid", default=os.environ.get("KUNCID", ""), help="kuncid binary (default: go build it)")
    ap.add_argument("--no-go", action="store_true",
                    help="leave clientlib (the Go load generator, go build ./bench) out")
    ap.add_argument("--only", default="", help="run only the cases whose name holds this")
    ap.add_argument("--profile", action="store_true", help="profile kunci with 50 threads instead")
    o = ap.parse_args()
    binary = o.kuncid
    tmp = tempfile.mkdtemp()
    try:
        if not binary:
            binary = os.path.join(tmp, "kuncid")
            subprocess.run(["go", "build", "-o", binary, "./cmd/kuncid"], cwd=HERE.parents[1], check=True)
        bench_bin = ""
        if not o.no_go and not o.profile:
            bench_bin = os.path.join(tmp, "bench")
            subprocess.run(["go", "build", "-o", bench_bin, "./bench"], cwd=HERE.parents[1], check=True)
        node, addr = start_kuncid(binary)
        if o.profile:
            profile(addr, o.duration)
            node.kill()
            return
        rs, port = start_redis()
        try:
            cases: dict[str, Callable[[int], float]] = {
                "kunci.Client (threads)": lambda n: kunci_threads(addr, n, o.duration),
                "redis-py (threads)": lambda n: redis_threads(port, n, o.duration),
                "kunci.AsyncClient (tasks)": lambda n: kunci_async(addr, n, o.duration),
                "redis.asyncio (tasks)": lambda n: redis_async(port, n, o.duration),
            }
            if bench_bin:
                cases["clientlib (Go, goroutines)"] = lambda n: clientlib_case(bench_bin, addr, n, o.duration)
            cases = {k: v for k, v in cases.items() if o.only in k}
            callers = [int(x) for x in o.callers.split(",")]
            got: dict[tuple[str, int], list[float]] = {}
            for rnd in range(o.rounds):
                for n in callers:
                    for name, f in cases.items():
                        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                        v = f(n)
                        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                        got.setdefault((name, n), []).append(v)
                        cpu = ""
                        if "Go" not in name:  # this process's CPU (every thread), per cycle
                            k = 1e6 / (v * (t1 - t0))
                            user, system = (r1.ru_utime - r0.ru_utime) * k, (r1.ru_stime - r0.ru_stime) * k
                            cpu = (f"  user {user:5.0f} µs, system {system:5.0f} µs, "
                                   f"{(r1.ru_nvcsw - r0.ru_nvcsw) * k / 1e6:4.1f} context switches a cycle")
                        print(f"round {rnd + 1}: {name:28} {n:3} callers {v:9.0f} cycles/s{cpu}", file=sys.stderr)
            print(f"\nPython {sys.version.split()[0]}, {os.cpu_count()} cores, "
                  f"{o.rounds} interleaved rounds of {o.duration:g} s, "
                  "medians (range)\n")
            print("| client | " + " | ".join(f"{n} caller{'s' if n > 1 else ''}" for n in callers) + " |")
            print("| --- |" + " --- |" * len(callers))
            for name in cases:
                cells = []
                for n in callers:
                    vs = got[(name, n)]
                    cells.append(f"{statistics.median(vs):,.0f} ({min(vs):,.0f}–{max(vs):,.0f})")
                print(f"| {name} | " + " | ".join(cells) + " |")
        finally:
            rs.kill()
            node.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def profile(addr: str, duration: float) -> None:
    """The 50-thread kunci case under cProfile: every thread's profile,
    the I/O thread's apart."""
    profs: list[cProfile.Profile] = []
    lock = threading.Lock()
    orig_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        p = cProfile.Profile()
        with lock:
            profs.append(p)
        p.enable()
        try:
            orig_run(self)
        finally:
            p.disable()

    threading.Thread.run = run  # type: ignore[method-assign,assignment]
    rate = kunci_threads(addr, 50, duration)
    threading.Thread.run = orig_run  # type: ignore[method-assign,assignment]
    print(f"{rate:,.0f} cycles/s under the profiler")
    io_thread, callers = profs[0], profs[1:]
    for title, ps in (("the I/O thread", [io_thread]), ("the 50 caller threads", callers)):
        s = io.StringIO()
        st = pstats.Stats(ps[0], stream=s)
        for p in ps[1:]:
            st.add(p)
        st.sort_stats("tottime").print_stats(18)
        print(f"\n=== {title} ===\n" + s.getvalue())


if __name__ == "__main__":
    main()
