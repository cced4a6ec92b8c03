"""Measuring through a TVM RPC tracker and two servers on 127.0.0.1, and every way that can fail:
each a one-line error or a retried measurement within a bounded time, never a hang."""
import signal
import socket
import threading
import time

import numpy as np
import pytest

from cachetile import builtin, preset, tune
from cachetile.api.autotune import TIE, autotune
from cachetile.api.request import PlanRequest
from cachetile.backends.base import get_backend
from cachetile.backends.llvm_trials import Kernel
from cachetile.backends.rpc import measure_remote, remote_target
from cachetile.backends.rpc_fleet import Fleet, free_port
from cachetile.backends.rpc_tracker import RpcAddress, RpcError, parse_rpc, preflight
from cachetile.models.errors import InvalidInput
from cachetile.models.measurement import random_inputs, reference

KEY = "cachetile-test"
HOST = preset("host")
W = builtin("gemm", {"m": 72, "n": 80, "k": 56})


def bounded(seconds: float):
    """Assert the block finishes within `seconds` (loosely: the machine is shared)."""
    class Bound:
        def __enter__(self):
            self.start = time.monotonic()
            return self

        def __exit__(self, kind, *exc):
            self.elapsed = time.monotonic() - self.start
            if kind is None:
                assert self.elapsed < seconds, f"took {self.elapsed:.1f} s, bound {seconds} s"
    return Bound()


def running(launcher: str):
    """A tracker and two one-thread servers; afterwards, no process of theirs is left."""
    with Fleet(servers=2, key=KEY, threads=1, launcher=launcher) as f:
        yield f
    assert f.leftover() == [], "processes left behind"


@pytest.fixture(scope="module")
def fleet():
    """The documented daemons: python -m tvm.exec.rpc_tracker and rpc_server."""
    yield from running("tvm.exec")


@pytest.fixture
def own_fleet():
    """A fleet a test may kill or freeze (the in-process launcher: quicker to start)."""
    yield from running("inproc")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Two planned kernels of W, exported as .so, with their inputs and numpy's outputs."""
    out = tmp_path_factory.mktemp("kernels")
    result = tune(W, HOST, time_limit=3, top=1)
    inputs = random_inputs(W, seed=1)
    computed = reference(W)({n: a.astype(np.float64) for n, a in inputs.items()})
    expected = {n: v for n, v in computed.items() if n not in inputs}
    ks = []
    for i, plan in enumerate([result.plan, *result.alternatives]):
        path = str(out / f"plan{i}.so")
        get_backend("llvm").build(W, HOST, plan).lib.export_library(path)
        ks.append(Kernel(f"plan{i}", path, W, inputs, expected))
    return ks


@pytest.mark.parametrize("spec, msg", [
    ("", "expects HOST:PORT:KEY"),
    ("localhost:9190", "expects HOST:PORT:KEY"),
    ("localhost:http:cpu", "port 'http' is not a number"),
    ("localhost:70000:cpu", "outside 1-65535"),
    (":9190:cpu", "empty host"),
    ("localhost:9190:", "the key must be non-empty"),
    ("a:1:b:c", "the key may not contain ':'"),
])
def test_bad_addresses_are_one_line(spec, msg):
    with pytest.raises(InvalidInput, match=msg) as e:
        parse_rpc(spec)
    assert "\n" not in str(e.value)


def test_addresses_parse():
    assert parse_rpc("127.0.0.1:9190:cpu") == RpcAddress("127.0.0.1", 9190, "cpu")
    assert str(parse_rpc(" [::1]:9190:x86 ")) == "[::1]:9190:x86"


def test_autotune_through_a_tracker_and_two_servers(fleet, tmp_path, monkeypatch):
    """The candidates are measured on both servers, then the leaders again one at a time; each
    matches numpy there; the plan returned is the fastest of them (or tied with it); the servers
    are free again afterwards."""
    from cachetile.backends import llvm_trials, rpc

    calls = []

    def recorded(kernels, *args, **kw):
        calls.append([k.name for k in kernels])
        return measure_remote(kernels, *args, **kw)

    monkeypatch.setattr(rpc, "measure_remote", recorded)
    req = PlanRequest(workload=W, hardware=HOST, time_limit=3, autotune=4, rpc=str(fleet.rpc))
    with bounded(120):
        result = autotune(req)
    a = result.autotune
    # All at once, then each leader alone (none when only one is within LEADERS_MARGIN).
    retimed = [c[0] for c in calls[1:]]
    assert len(calls[0]) == len(a.candidates) and all(len(c) == 1 for c in calls[1:])
    assert len(retimed) == 0 or 2 <= len(retimed) <= llvm_trials.MAX_LEADERS
    assert len(set(retimed)) == len(retimed) and set(retimed) <= set(calls[0])
    assert a.rpc == str(fleet.rpc) and a.measured == len(a.candidates) >= 2, a
    servers = {c.measurement.device.rsplit(" ", 1)[1] for c in a.candidates}
    assert servers == {f"127.0.0.1:{s.port}" for s in fleet.servers}
    assert all(c.measurement.max_abs_error < 1e-2 and c.measurement.reference_seconds is None for c in a.candidates)
    measured = [c.measured_seconds for c in a.candidates]
    assert measured[1:] == sorted(measured[1:]) and measured[0] <= min(measured) * (1 + TIE)
    assert result.plan.predicted_seconds == a.candidates[0].predicted_seconds
    assert a.threads == 1 and "ran on 1 thread(s), the plans were made for" in a.note
    fleet.wait_registered(2)


def test_remote_target_is_the_servers_llvm(fleet):
    import tvm

    target = remote_target(fleet.rpc)
    assert target["mtriple"] == tvm.target.codegen.llvm_get_system_triple()
    assert tvm.target.codegen.llvm_is_valid_cpu(target["mcpu"], target["mtriple"]) and target["num-cores"] == 1


def test_nothing_listening_is_one_line_and_fast(kernels):
    port = free_port()
    with bounded(3), pytest.raises(RpcError, match=r"^no RPC tracker at 127\.0\.0\.1:\d+ \(connection refused\)$"):
        measure_remote(kernels, RpcAddress("127.0.0.1", port, KEY))


def test_a_silent_port_times_out():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with bounded(5), pytest.raises(RpcError, match="did not answer within 2 s"):
            preflight(RpcAddress("127.0.0.1", port, KEY), timeout=2)


def test_a_server_address_is_not_a_tracker(fleet):
    with bounded(5), pytest.raises(RpcError, match="is not a TVM RPC tracker"):
        preflight(RpcAddress("127.0.0.1", fleet.servers[0].port, KEY), timeout=2)


def test_a_mismatched_key_fails_fast_naming_the_keys(fleet, kernels):
    """TVM's own request would wait forever for a key no server has."""
    with bounded(3), pytest.raises(RpcError, match=f"has no server with key 'gpu' \\(its keys: {KEY}\\)$"):
        measure_remote(kernels, RpcAddress("127.0.0.1", fleet.tracker.port, "gpu"))


def test_a_server_killed_mid_measurement_is_retried_on_the_other(own_fleet, kernels):
    killed = {}

    def on_event(event, name, server):
        if event == "start" and name == "plan0" and not killed:
            killed["server"] = server
            threading.Timer(0.7, own_fleet.kill, args=(own_fleet.server_at(server),)).start()

    # 101 timed rounds of >= 20 ms each: about 2 s, so the kill lands mid-measurement. About 6 s
    # alone, 33 s once beside the rest of `make test` on two busy cores; a hang never ends.
    with bounded(90):
        results = measure_remote(kernels, own_fleet.rpc, timeout=15, repeat=100, on_event=on_event)
    first = results[0]
    assert first.ok and first.attempts == 2 and first.server != killed["server"], first
    assert len(first.history) == 1 and "\n" not in first.history[0]
    assert all(r.ok for r in results)


def test_a_frozen_server_hits_the_time_limit_and_the_retry_succeeds(own_fleet, kernels):
    """SIGSTOP (no reset, no answer): TVM would wait forever; the caller gives up at the limit."""
    frozen = {}

    def on_event(event, name, server):
        if event == "start" and name == "plan0" and not frozen:
            frozen["server"] = server
            threading.Timer(0.2, own_fleet.kill, args=(own_fleet.server_at(server), signal.SIGSTOP)).start()

    with bounded(90):  # 31 rounds of >= 20 ms: about 1 s to measure; the whole test about 10 s alone
        results = measure_remote(kernels[:1], own_fleet.rpc, timeout=5, repeat=30, on_event=on_event)
    (r,) = results
    assert r.ok and r.attempts == 2 and r.server != frozen["server"], r
    assert r.history[0].endswith("no result after 5 s measuring (server %s)" % frozen["server"])


def test_every_server_dying_reports_each_kernel_in_one_line(own_fleet, kernels):
    started = threading.Event()

    def on_event(event, name, server):
        if event == "start" and not started.is_set():
            started.set()
            threading.Timer(0.5, lambda: [own_fleet.kill(s) for s in own_fleet.servers]).start()

    with bounded(30):
        results = measure_remote(kernels * 2, own_fleet.rpc, timeout=5, repeat=100, queue_timeout=3,
                                 on_event=on_event)
    assert not any(r.ok for r in results)
    assert all(r.error and "\n" not in r.error for r in results), [r.error for r in results]


def test_cli_reports_a_bad_tracker_in_one_line(capsys, monkeypatch, tmp_path):
    from cachetile.api.cli import main

    monkeypatch.setenv("CACHETILE_CACHE", str(tmp_path / "plans.sqlite"))
    with bounded(20):
        status = main(["gemm", "--M", "16", "--N", "16", "--K", "16", "--autotune", "2",
                       "--rpc", f"127.0.0.1:{free_port()}:{KEY}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("tune: error: no RPC tracker at 127.0.0.1:"), err
