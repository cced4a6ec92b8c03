"""The REST service through a real uvicorn server on loopback."""
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from service_load import load, plan_bodies, running_server  # noqa: E402
from test_cli import FULL  # noqa: E402  (the full-form gemm the CLI tests use)

from cachetile.api.cli import build_parser  # noqa: E402
from cachetile.api.service import Settings, create_app  # noqa: E402

OPENAPI = Path(__file__).parents[1] / "api" / "openapi.json"
# `auto`, bounded by work (1-1.5 s here): `enumerate` ran these GEMMs into their 10 s time limit.
GEMM = {"workload": {"kind": "gemm", "dims": {"m": 48, "n": 40, "k": 36}}, "hardware": "v100", "solver": "auto", "top": 1}
# An inner link that is slow on a four-level hierarchy: enumerate runs into its time limit here.
SLOW_HW = {"name": "slow", "peak_flops": 1e20, "levels": [
    {"name": "R", "capacity_bytes": 400, "bandwidth_bytes_per_s": 1},
    {"name": "L1", "capacity_bytes": 49152, "bandwidth_bytes_per_s": 1e12},
    {"name": "L2", "capacity_bytes": 2097152, "bandwidth_bytes_per_s": 1e12},
    {"name": "L3", "capacity_bytes": 503316480, "bandwidth_bytes_per_s": 1e12},
]}
SLOW = {"workload": {"kind": "gemm-chain", "dims": {"m": 512, "k": 64, "l": 512, "n": 64}}, "hardware": SLOW_HW,
        "time_limit": 4, "top": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("cache") / "plans.sqlite", "--workers", "1",
                        "--max-time-limit", "20") as url:
        yield url


def test_served_schema_matches_committed_openapi(tmp_path):
    """Regenerate with: tune serve --openapi > api/openapi.json"""
    served = create_app(Settings(cache_path=tmp_path / "c.sqlite")).openapi()
    assert served == json.loads(OPENAPI.read_text()), "the API changed: regenerate api/openapi.json"


def test_100_concurrent_plan_requests(server):
    figures = load(server, requests=100, distinct=4)
    print(f"\nconcurrency: {json.dumps(figures)}")
    assert figures["errors"] == 0, figures["first_error"]
    assert figures["bodies"] == 4 and figures["identical"]  # identical requests, identical bytes


def test_plan_is_the_cli_document(server):
    body = plan_bodies(1)[0]
    r = httpx.post(f"{server}/v1/plans", json=body, timeout=60)
    assert r.status_code == 200
    w = body["workload"]["dims"]
    cli = subprocess.run(
        [sys.executable, "-m", "cachetile.api.cli", "gemm-chain", "--M", str(w["m"]), "--K", str(w["k"]),
         "--L", str(w["l"]), "--N", str(w["n"]), "--hardware", body["hardware"], "--solver", body["solver"],
         "--time-limit", str(body["time_limit"]), "--top", str(body["top"]), "--json"],
        capture_output=True, text=True, timeout=60, check=True).stdout
    served, printed = r.json(), json.loads(cli)
    # Two solves of one request differ only in how long they took.
    assert served["solver"].pop("seconds") > 0 and printed["solver"].pop("seconds") > 0
    assert served == printed


def test_cache_survives_a_restart(tmp_path):
    cache = tmp_path / "plans.sqlite"
    with running_server(cache) as url:
        first = httpx.post(f"{url}/v1/plans", json=GEMM, timeout=60)
        assert first.headers["x-cache"] == "miss"
        assert httpx.get(f"{url}/healthz").json()["cached_plans"] == 1
    with running_server(cache) as url:
        again = httpx.post(f"{url}/v1/plans", json=GEMM, timeout=60)
    assert again.headers["x-cache"] == "hit"
    assert again.content == first.content  # solver.seconds included: the stored answer, not a new solve


def test_plans_an_older_model_cached_are_not_served(tmp_path, monkeypatch):
    """The cache key holds a hash of the model's source (request.model_version): a document cached
    before an upgrade that changed a model file is a miss, not the answer."""
    from cachetile.api import request as req

    model = tmp_path / "models"
    (model / "targets").mkdir(parents=True)
    (model / "costmodel.py").write_text("NORM = 4\n")
    (model / "targets" / "simd.py").write_text("LANES = 16\n")
    before = req.source_hash([model])
    assert req.source_hash([model]) == before and len(before) == 16
    (model / "targets" / "simd.py").write_text("LANES = 8\n")
    assert req.source_hash([model]) != before
    (model / "targets" / "simd.py").write_text("LANES = 16\n")
    (model / "targets" / "simd.py").rename(model / "simd.py")  # same bytes, moved: another model
    assert req.source_hash([model]) != before

    request = req.PlanRequest.model_validate(GEMM)
    key = request.cache_key()
    assert request.cache_key() == key
    monkeypatch.setattr(req, "model_version", lambda: before)
    assert request.cache_key() != key


@pytest.mark.parametrize("body,field", [
    ({**GEMM, "top": -1}, "body.top: Input should be greater than or equal to 0"),
    ({**GEMM, "solver": "magic"}, "body.solver: Input should be 'auto', 'enumerate', 'pyomo-ipopt' or 'pyomo-scip'"),
    ({**GEMM, "hardware": "tpu"}, "body.hardware: unknown hardware 'tpu'; expected one of host, h100, a100, v100"),
    ({**GEMM, "hardware": "/etc/passwd"}, "body.hardware: unknown hardware '/etc/passwd'"),
    ({**GEMM, "workload": {"kind": "gemm", "dims": {"m": 4, "n": 4}}}, "body.workload: gemm.dims.k: Field required"),
    ({**GEMM, "workload": {"kind": "gemm", "dims": {"m": 0, "n": 4, "k": 4}}}, "body.workload: gemm.dims.m: Input should be greater than or equal to 1"),
    ({**GEMM, "workload": {"kind": "gemm", "dims": {"m": "4", "n": 4, "k": 4}}}, "body.workload: gemm.dims.m: Input should be a valid integer"),
    ({**GEMM, "workload": {**FULL, "dims": {"m": 4, "n": 4, "k": 0}}}, "body.workload: dims: loop 'k' has extent 0; extents must be >= 1"),
    ({**GEMM, "workload": {**FULL, "ops": FULL["ops"] * 2}}, "body.workload: op outputs must be unique, got ['C', 'C']"),
    # A tensor indexed by no loop: 422, not the IndexError (and 500) it once was.
    ({**GEMM, "workload": {**FULL, "tensors": {**FULL["tensors"], "A": {"dims": []}}}},
     "body.workload: tensors.A.dims: List should have at least 1 item after validation, not 0"),
    ({**GEMM, "workload": {**FULL, "dims": {"m": 4, "n": True, "k": 4}}}, "body.workload: dims: loop 'n' has extent True"),
    # A vector narrower than one element: found when solving, still one line and 422.
    ({**GEMM, "workload": {"kind": "gemm", "dims": {"m": 8, "n": 8, "k": 8}, "dtype": "float64"},
      "hardware": {"name": "narrow", "peak_flops": 1e12, "vector_bytes": 4,
                   "levels": [{"name": "registers", "capacity_bytes": 2048, "bandwidth_bytes_per_s": 1e12}]}},
     "invalid: vector_bytes 4 of 'narrow' holds no float64 element (8 bytes)"),
    ({**GEMM, "top": "3"}, "body.top: Input should be a valid integer"),
    ({**GEMM, "time_limit": 0}, "body.time_limit: Input should be greater than 0"),
    ({**GEMM, "time_limit": 30}, "body.time_limit: 30 s exceeds this server's limit of 20 s"),
    ({**GEMM, "colour": "red"}, "body.colour: Extra inputs are not permitted"),
    ({"hardware": "v100"}, "body.workload: Field required"),
    ({**GEMM, "hardware": {"name": "x", "levels": [], "peak_flops": 1}},
     "body.hardware: levels: List should have at least 1 item after validation, not 0"),
    ({**GEMM, "hardware": {"name": "x", "peak_flops": 1, "levels": [
        {"name": f"L{i}", "capacity_bytes": 2**(4 + i), "bandwidth_bytes_per_s": 1} for i in range(9)]}},
     "body.hardware: levels: List should have at most 8 items after validation, not 9"),
])
def test_invalid_body_is_422_naming_the_field(server, body, field):
    r = httpx.post(f"{server}/v1/plans", json=body, timeout=30)
    assert r.status_code == 422
    assert r.json()["detail"].startswith(field), r.json()


def test_infeasible_is_422_with_the_reason(server):
    tiny = {"name": "tiny", "peak_flops": 1e12, "levels": [{"name": "near", "capacity_bytes": 8, "bandwidth_bytes_per_s": 1e9}]}
    r = httpx.post(f"{server}/v1/plans", json={**GEMM, "hardware": tiny}, timeout=30)
    assert r.status_code == 422
    assert r.json()["detail"] == "infeasible: level 'near' holds 8 bytes but the smallest tiling (every tile 1) needs 12 bytes"


def test_hardware_endpoints_match_the_cli(server):
    assert httpx.get(f"{server}/v1/hardware").json() == {"presets": ["host", "h100", "a100", "v100"]}
    cli = subprocess.run([sys.executable, "-m", "cachetile.api.cli", "hardware", "a100", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert httpx.get(f"{server}/v1/hardware/a100").json() == json.loads(cli)
    r = httpx.get(f"{server}/v1/hardware/tpu")
    assert r.status_code == 404 and r.json()["detail"].startswith("unknown hardware 'tpu'")


def poll(url: str, job_id: str, until: set[str], timeout_s: float = 60.0) -> list[dict]:
    """GET the job until its status is in `until`; returns every status seen."""
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.append(httpx.get(f"{url}/v1/jobs/{job_id}").json())
        if seen[-1]["status"] in until:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {seen[-1]['status']} after {timeout_s} s")


def test_plan_only_job(server):
    body = {**GEMM, "workload": {"kind": "gemm", "dims": {"m": 50, "n": 40, "k": 30}}}
    r = httpx.post(f"{server}/v1/jobs", json={**body, "measure": False}, timeout=30)
    assert r.status_code == 202 and r.json()["status"] == "queued" and r.json()["fraction"] == 0
    assert r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
    seen = poll(server, r.json()["id"], {"done", "failed"})
    done = seen[-1]
    assert done["status"] == "done" and done["fraction"] == 1.0 and done["error"] is None
    assert done["result"]["measurements"] is None
    fractions = [s["fraction"] for s in seen]
    assert fractions == sorted(fractions)
    plan = httpx.post(f"{server}/v1/plans", json=body, timeout=30)
    assert plan.headers["x-cache"] == "hit" and plan.json() == done["result"]["plan"]


def test_cancel_kills_the_solve(server):
    """The server has one solver process: a cancelled solve that kept it would hold up the next plan."""
    r = httpx.post(f"{server}/v1/jobs", json={**SLOW, "measure": False}, timeout=30)
    job_id = r.json()["id"]
    poll(server, job_id, {"running"})
    time.sleep(0.3)  # into the solve
    cancelled = httpx.delete(f"{server}/v1/jobs/{job_id}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    start = time.perf_counter()
    quick = httpx.post(f"{server}/v1/plans", json={**GEMM, "workload": {"kind": "gemm", "dims": {"m": 9, "n": 7, "k": 5}}},
                       timeout=30)
    assert quick.status_code == 200
    assert time.perf_counter() - start < 2.0  # the slow solve had 3.5 s of its 4 s left
    time.sleep(0.5)
    assert httpx.get(f"{server}/v1/jobs/{job_id}").json()["status"] == "cancelled"
    assert httpx.delete(f"{server}/v1/jobs/nope").status_code == 404
    assert httpx.get(f"{server}/v1/jobs/nope").json() == {"detail": "no job 'nope'", "errors": []}


def test_job_errors_are_reported(server):
    r = httpx.post(f"{server}/v1/jobs", json={**GEMM, "measure": False, "workload": {"kind": "gemm", "dims": {"m": 4, "n": 4}}})
    assert r.status_code == 422 and r.json()["detail"].startswith("body.workload: gemm.dims.k: Field required")
    big = {**GEMM, "workload": {"kind": "gemm", "dims": {"m": 20000, "n": 20000, "k": 20000}}}
    r = httpx.post(f"{server}/v1/jobs", json=big)
    assert r.status_code == 422 and "measuring needs 4800000000 bytes of tensors" in r.json()["detail"]
    tiny = {"name": "tiny", "peak_flops": 1e12, "levels": [{"name": "near", "capacity_bytes": 8, "bandwidth_bytes_per_s": 1e9}]}
    r = httpx.post(f"{server}/v1/jobs", json={**GEMM, "hardware": tiny, "measure": False})
    failed = poll(server, r.json()["id"], {"done", "failed"})[-1]
    assert failed["status"] == "failed" and failed["message"] == "infeasible"
    assert failed["error"] == "level 'near' holds 8 bytes but the smallest tiling (every tile 1) needs 12 bytes"


def test_measure_job(server):
    body = {**GEMM, "workload": {"kind": "gemm", "dims": {"m": 64, "n": 64, "k": 64}}, "hardware": "host", "top": 1}
    r = httpx.post(f"{server}/v1/jobs", json=body, timeout=30)
    seen = poll(server, r.json()["id"], {"done", "failed"}, timeout_s=300)
    done = seen[-1]
    assert done["status"] == "done", done["error"]
    fractions = [s["fraction"] for s in seen]
    assert fractions == sorted(fractions) and done["fraction"] == 1.0
    result = done["result"]
    assert len(result["measurements"]) == 1 + len(result["plan"]["alternatives"])
    for m in result["measurements"]:
        assert m["kernel_gflops"] > 0 and m["max_abs_error"] < 1e-3 and m["reference"] == "numpy"
    assert [e["files"] for e in result["exports"]] == [["plan.json", "schedule.py", "kernel.so"]] * len(result["measurements"])
    assert all(Path(e["directory"], "kernel.so").stat().st_size > 0 for e in result["exports"])


def test_gpu_job_exports_checked_cuda_and_says_why_it_was_not_measured(server):
    """A GPU job on a server without a GPU builds and exports every plan (nvcc-checked where
    nvcc exists) and finishes; that measuring needs a GPU is part of its result, not a failure."""
    body = {"workload": {"kind": "gemm", "dims": {"m": 128, "n": 96, "k": 64}}, "hardware": "h100", "top": 1}
    r = httpx.post(f"{server}/v1/jobs", json=body, timeout=30)
    assert r.status_code == 202
    done = poll(server, r.json()["id"], {"done", "failed"}, timeout_s=300)[-1]
    assert done["status"] == "done", done["error"]
    result = done["result"]
    plans = 1 + len(result["plan"]["alternatives"])
    assert [e["files"] for e in result["exports"]] == [["plan.json", "schedule.py", "kernel.cu", "launch.json"]] * plans
    for e in result["exports"]:
        source = Path(e["directory"], "kernel.cu").read_text()
        assert '__global__' in source and "blockIdx.x" in source
        assert e["checks"] == ["nvcc -arch=sm_90: " + ("compiled" if shutil.which("nvcc") else
                                                          "not checked (nvcc is not on PATH)")]
    if importlib.util.find_spec("cupy") is None:
        assert result["measurements"] is None
        assert result["note"].startswith("not measured: cuda kernels run on a GPU, and this server has none (CuPy")


def test_serve_flags():
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.max_time_limit) == ("127.0.0.1", 8000, 60.0)


def test_conv_and_einsum_forms_and_their_errors(server):
    conv = {"kind": "conv2d", "dims": {"n": 1, "c": 8, "h": 9, "w": 9, "k": 4, "r": 3, "s": 3}, "stride": 2, "pad": 1}
    r = httpx.post(f"{server}/v1/plans", json={"workload": conv, "hardware": "h100", "top": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["workload"]["tensors"]["I"]["dims"][2] == "2*oh+kh-1"
    eq = {"equations": ["C[m,l] = A[m,k]*B[k,l]", "E[m,n] = C[m,l]*D[l,n]"], "dims": {"m": 8, "l": 8, "k": 4, "n": 4}}
    r = httpx.post(f"{server}/v1/plans", json={"workload": eq, "hardware": "h100", "top": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["workload"]["tensors"]["C"]["role"] == "intermediate"
    bad = {**eq, "equations": ["C[m,l] = A[m,k]*B[k,l]", "E[m,n] = C[m,l] D[l,n]"]}
    r = httpx.post(f"{server}/v1/plans", json={"workload": bad, "hardware": "h100"}, timeout=60)
    assert r.status_code == 422
    assert "equation 2 'E[m,n] = C[m,l] D[l,n]': expected '*' or the end, found 'D' at column 17" in r.json()["detail"]
    r = httpx.post(f"{server}/v1/plans", json={"workload": {**conv, "layout": "chw"}, "hardware": "h100"}, timeout=60)
    assert r.status_code == 422 and "layout" in r.json()["detail"]
