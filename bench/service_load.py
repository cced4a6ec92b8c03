"""Concurrent load on a real `tune serve` on loopback: requests, errors, p50 and p99 latency.

    .venv/bin/python bench/service_load.py [--requests 100] [--distinct 4]

Starts the server with a fresh cache, sends every request at once (each
distinct request repeated), and checks that identical requests got identical
answers. tests/test_service.py uses the same helpers.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(cache: Path, *flags: str, startup_s: float = 60.0):
    """`tune serve` on 127.0.0.1 at a free port; yields its base URL and stops it afterwards."""
    port = free_port()
    cmd = [sys.executable, "-m", "cachetile.api.cli", "serve", "--port", str(port), "--cache", str(cache), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not answer /healthz within {startup_s:g} s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def plan_bodies(distinct: int) -> list[dict]:
    """Distinct, quickly solved requests: gemm-chains of growing size on the V100 preset."""
    return [
        {"workload": {"kind": "gemm-chain", "dims": {"m": 64 * (i + 1), "k": 64, "l": 64 * (i + 1), "n": 64}},
         "hardware": "v100", "solver": "enumerate", "time_limit": 10, "top": 2}
        for i in range(distinct)
    ]


async def _fire(url: str, bodies: list[dict], timeout_s: float):
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        async def one(body):
            start = time.perf_counter()
            try:
                r = await client.post("/v1/plans", json=body)
                return r.status_code, r.text, time.perf_counter() - start
            except httpx.HTTPError as exc:
                return None, repr(exc), time.perf_counter() - start
        return await asyncio.gather(*(one(b) for b in bodies))


def load(url: str, requests: int, distinct: int, seed: int = 0, timeout_s: float = 120.0) -> dict:
    """Send `requests` plan requests at once, cycling through `distinct` bodies; returns the figures."""
    bodies = plan_bodies(distinct)
    order = [i % distinct for i in range(requests)]
    random.Random(seed).shuffle(order)
    start = time.perf_counter()
    answers = asyncio.run(_fire(url, [bodies[i] for i in order], timeout_s))
    wall = time.perf_counter() - start
    errors = [a for a in answers if a[0] != 200]
    texts: dict[int, set[str]] = {}
    for i, (_, text, _) in zip(order, answers):
        texts.setdefault(i, set()).add(text)
    latencies = sorted(a[2] for a in answers)
    return {
        "requests": requests,
        "distinct": distinct,
        "errors": len(errors),
        "first_error": errors[0][:2] if errors else None,
        "bodies": len(texts),
        "identical": all(len(t) == 1 for t in texts.values()),  # every body always got the same bytes
        "p50_s": statistics.median(latencies),
        "p99_s": latencies[max(0, round(0.99 * len(latencies)) - 1)],
        "max_s": latencies[-1],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--distinct", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp) / "plans.sqlite") as url:
        cold = load(url, args.requests, args.distinct)
        warm = load(url, args.requests, args.distinct, seed=1)
    for name, figures in (("cold cache", cold), ("warm cache", warm)):
        print(f"{name}: {json.dumps(figures)}")
    print(f"cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
