"""`autotune: K` on POST /v1/plans and /v1/jobs, through a real `tune serve`."""
import httpx
import pytest
from test_service import poll, server  # noqa: F401  (the module's own `tune serve`)

BODY = {"workload": {"kind": "gemm", "dims": {"m": 40, "n": 48, "k": 24}}, "hardware": "host", "time_limit": 3,
        "autotune": 2}


def test_autotuned_plan_is_cached(server):
    first = httpx.post(f"{server}/v1/plans", json=BODY, timeout=120)
    assert first.status_code == 200 and first.headers["x-cache"] == "miss", first.text
    a = first.json()["autotune"]
    assert a["k"] == 2 and a["measured"] == len(a["candidates"]) >= 1
    assert all(c["predicted_seconds"] > 0 and c["measured_seconds"] > 0 for c in a["candidates"])
    again = httpx.post(f"{server}/v1/plans", json=BODY, timeout=30)
    assert again.headers["x-cache"] == "hit" and again.content == first.content
    # The same plan request without autotune is another entry: the model's plan, unmeasured.
    plain = httpx.post(f"{server}/v1/plans", json={**BODY, "autotune": 0}, timeout=60)
    assert plain.status_code == 200 and "autotune" not in plain.json()


def test_autotune_job_reports_its_progress_and_the_measurements(server):
    body = {**BODY, "workload": {"kind": "gemm", "dims": {"m": 56, "n": 32, "k": 40}}}
    r = httpx.post(f"{server}/v1/jobs", json=body, timeout=30)
    assert r.status_code == 202, r.text
    seen = poll(server, r.json()["id"], {"done", "failed"}, timeout_s=300)
    done = seen[-1]
    assert done["status"] == "done", done["error"]
    fractions = [s["fraction"] for s in seen]
    assert fractions == sorted(fractions) and any(0 < f < 0.8 for f in fractions), fractions
    result = done["result"]
    ran = [c for c in result["plan"]["autotune"]["candidates"] if c["measurement"]]
    assert result["measurements"] == [c["measurement"] for c in ran]  # measured once, by the autotune
    assert len(result["exports"]) == 1 + len(result["plan"]["alternatives"]) == len(ran)


@pytest.mark.parametrize("body, detail", [
    ({**BODY, "autotune": 9}, "body.autotune: 9 candidates exceed this server's limit of 8 (tune serve --max-autotune)"),
    ({**BODY, "rpc": "127.0.0.1:9190:cpu"}, "body.rpc: this server does not send kernels to RPC trackers"),
    ({**BODY, "rpc": "localhost:9190"}, "body.rpc: expects HOST:PORT:KEY"),
    ({**BODY, "autotune": 0, "rpc": "localhost:9190:cpu"}, "body: rpc measures autotune candidates"),
    ({**BODY, "autotune": 33}, "body.autotune: Input should be less than or equal to 32"),
    ({**BODY, "target_host": "llvm"}, "body: target_host (--target-host) compiles for RPC servers"),
    ({**BODY, "workload": {"kind": "gemm", "dims": {"m": 20000, "n": 20000, "k": 20000}}},
     "body: measuring needs 4800000000 bytes of tensors"),
])
def test_bad_autotune_bodies_are_422(server, body, detail):
    r = httpx.post(f"{server}/v1/plans", json=body, timeout=30)
    assert r.status_code == 422 and r.json()["detail"].startswith(detail), r.json()


def test_a_gpu_autotune_without_a_gpu_is_422_unavailable(server):
    from cachetile.backends.cuda_run import gpu_unavailable

    if not gpu_unavailable():
        pytest.skip("this machine has a GPU")
    r = httpx.post(f"{server}/v1/plans", json={**BODY, "hardware": "h100"}, timeout=60)
    assert r.status_code == 422
    assert r.json()["detail"].startswith("unavailable: --autotune times kernels on this machine, and cuda kernels")
