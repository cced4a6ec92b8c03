"""The `tune` console script end to end, including every bad input the issue names."""
import json
import subprocess
import sys

import pytest

from cachetile.models.hardware import host
from cachetile.models.workload import builtin

TUNE = [sys.executable, "-m", "cachetile.api.cli"]


def tune(*args, check_rc=0):
    proc = subprocess.run([*TUNE, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == check_rc, proc.stderr
    return proc


def bad(*args, match):
    proc = tune(*args, check_rc=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tune: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert match in lines[0], lines[0]
    return lines[0]


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


CUSTOM = {
    "name": "two-level",
    "levels": [
        {"name": "near", "capacity_bytes": 4096, "bandwidth_bytes_per_s": 1e11},
        {"name": "far", "capacity_bytes": 131072, "bandwidth_bytes_per_s": 1e10},
    ],
    "peak_flops": 1e15,
}


def test_json_document_shape_for_gemm_chain(tmp_path):
    hw = write(tmp_path, "hw.json", CUSTOM)
    doc = json.loads(tune("gemm-chain", "--M", "64", "--K", "32", "--batch", "2", "--hardware", hw, "--json", "--top", "2").stdout)
    assert set(doc) == {"workload", "hardware", "plan", "solver", "alternatives"}
    w = doc["workload"]
    assert w["dims"] == {"b": 2, "m": 64, "l": 64, "k": 32, "n": 64}
    assert w["signature"] == ["A", "B", "D", "E"]
    assert w["tensors"]["C"] == {"dims": ["b", "m", "l"], "role": "intermediate"}
    assert [op["name"] for op in w["ops"]] == ["gemm1", "gemm2"]
    defaults = {"kind": "cpu", "cores": 1, "vector_bytes": None, "gpu": None, "call_seconds": 0.0,
                "parallel_region_seconds": 0.0, "calibrated": None, "accumulator_bytes_per_s": None,
                "run_start_bytes": 128.0, "short_run_start_bytes": None, "run_start_reach": None,
                "short_run_start_reach": None,
                "band_stall": None, "tall_band_stall": None, "tall_rows": None, "stride_stall": None, "fed_share": None, "copy_vector_seconds": 0.0, "copy_element_seconds": 0.0,
                "handoff_seconds": 0.0, "shared_line_seconds": 0.0, "fma_chains": None}
    levels = [{**lv, "ways": None} for lv in CUSTOM["levels"]]
    assert doc["hardware"] == {**CUSTOM, **defaults, "levels": levels}  # defaults filled in
    plan = doc["plan"]
    assert [lp["name"] for lp in plan["levels"]] == ["near", "far"]
    assert {lp["capacity_bytes"] for lp in plan["levels"]} == {4096, 131072}
    assert all(lp["mu_bytes"] <= lp["capacity_bytes"] for lp in plan["levels"])
    assert set(plan) == {"levels", "predicted_seconds", "bottleneck", "serial_seconds", "caches", "launch"}
    assert plan["launch"] is None and plan["serial_seconds"] == 0.0  # scalar CPUs: the plain DV model
    assert set(plan["levels"][0]) == {"name", "order", "tile", "dv_bytes", "mu_bytes", "copy_bytes", "expected_bytes",
                                      "link_seconds", "capacity_bytes"}
    assert doc["solver"]["status"] in ("optimal", "feasible") and doc["solver"]["name"] == "auto"
    assert len(doc["alternatives"]) <= 2


def test_custom_hardware_file_sets_levels_and_bottleneck(tmp_path):
    hw = write(tmp_path, "hw.json", CUSTOM)
    doc = json.loads(tune("gemm", "--M", "128", "--N", "128", "--K", "128", "--hardware", hw, "--json").stdout)
    plan = doc["plan"]
    times = {lp["name"]: lp["dv_bytes"] / lv["bandwidth_bytes_per_s"] for lp, lv in zip(plan["levels"], CUSTOM["levels"])}
    assert plan["bottleneck"] == max(times, key=times.get)
    assert plan["predicted_seconds"] == pytest.approx(max(times.values()))
    # No hardware cache, no kernel costs: the link is charged its DV, and that is the traffic expected.
    assert [lp["link_seconds"] for lp in plan["levels"]] == pytest.approx(list(times.values()))
    assert all(lp["expected_bytes"] == lp["dv_bytes"] for lp in plan["levels"])


def test_workload_file_round_trips_the_plan_document(tmp_path):
    out = tune("gemm", "--M", "32", "--N", "48", "--K", "16", "--hardware", "v100", "--json").stdout
    path = write(tmp_path, "doc.json", out)
    again = json.loads(tune("workload", path, "--hardware", "v100", "--json").stdout)
    assert again["workload"] == json.loads(out)["workload"]
    assert again["plan"]["predicted_seconds"] == json.loads(out)["plan"]["predicted_seconds"]


def test_custom_workload_file(tmp_path):
    # A matrix-vector chain the built-ins do not cover: y[i] = A[i,j] x[j]; z[i] = y[i] * s[i] as a 1-loop op.
    workload = {
        "kind": "gemv",
        "dims": {"i": 64, "j": 48},
        "dtype": "float64",
        "tensors": {"A": {"dims": ["i", "j"]}, "x": {"dims": ["j"]}, "y": {"dims": ["i"]}},
        "ops": [{"name": "gemv", "loops": ["i", "j"], "inputs": ["A", "x"], "output": "y"}],
    }
    doc = json.loads(tune("workload", write(tmp_path, "w.json", workload), "--hardware", "a100", "--json").stdout)
    assert doc["workload"]["signature"] == ["A", "x", "y"]
    assert doc["plan"]["levels"][2]["dv_bytes"] >= 8 * (64 * 48 + 48 + 64)


def test_table_output_lists_every_level():
    out = tune("gemm", "--M", "256", "--N", "256", "--K", "256", "--hardware", "h100", "--top", "1").stdout
    for name in ("registers", "shared", "L2"):
        assert any(line.startswith(name) for line in out.splitlines())
    assert "alternative 1:" in out and "bound by" in out


def test_hardware_command():
    assert "h100" in tune("hardware").stdout
    doc = json.loads(tune("hardware", "a100", "--json").stdout)
    assert [lv["name"] for lv in doc["levels"]] == ["registers", "shared", "L2"]
    assert doc["levels"][1]["capacity_bytes"] == 163 * 1024
    doc = json.loads(tune("hardware", "host", "--json").stdout)
    assert doc == json.loads(host().model_dump_json())
    assert doc["levels"][0]["name"] == "registers"


def test_gemm_chain_defaults_to_m():
    doc = json.loads(tune("gemm-chain", "--M", "32", "--hardware", "v100", "--json").stdout)
    assert doc["workload"]["dims"] == {"m": 32, "l": 32, "k": 32, "n": 32}


@pytest.mark.parametrize(
    "args,match",
    [
        (["gemm", "--M", "0", "--N", "4", "--K", "4"], "argument --M: 0 must be >= 1"),
        (["gemm", "--M", "-3", "--N", "4", "--K", "4"], "argument --M: -3 must be >= 1"),
        (["gemm", "--M", "x", "--N", "4", "--K", "4"], "argument --M: 'x' is not an integer"),
        (["gemm-chain", "--M", "8", "--batch", "0"], "argument --batch: 0 must be >= 1"),
        (["gemm", "--M", "4", "--N", "4", "--K", "4", "--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
        (["gemm", "--M", "4", "--N", "4", "--K", "4", "--hardware", "tpu"], "unknown hardware 'tpu'"),
        (["gemm", "--M", "4", "--N", "4", "--K", "4", "--solver", "magic"], "argument --solver: invalid choice: 'magic'"),
        (["gemm", "--M", "4", "--N", "4", "--K", "4", "--time-limit", "0"], "argument --time-limit: 0 must be > 0"),
        (["gemm", "--M", "4", "--N", "4", "--K", "4", "--time-limit", "inf"], "argument --time-limit: 'inf' is not a finite number"),
        (["gemm", "--M", "4", "--N", "4", "--K", "4", "--time-limit", "nan"], "argument --time-limit: 'nan' is not a finite number"),
        (["serve", "--max-time-limit", "inf"], "argument --max-time-limit: 'inf' is not a finite number"),
        (["gemm", "--M", "4", "--N", "4", "--K", "4", "--top", "-1"], "argument --top: -1 must be >= 0"),
        (["gemm", "--M", "4", "--N", "4"], "the following arguments are required: --K"),
        (["workload", "/nonexistent/w.json"], "cannot read /nonexistent/w.json"),
        (["hardware", "tpu"], "unknown hardware 'tpu'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments(args, match):
    bad(*args, match=match)


def test_capacity_nothing_fits_in(tmp_path):
    tiny = {**CUSTOM, "levels": [{"name": "near", "capacity_bytes": 8, "bandwidth_bytes_per_s": 1e9}]}
    bad("gemm", "--M", "16", "--N", "16", "--K", "16", "--hardware", write(tmp_path, "hw.json", tiny),
        match="level 'near' holds 8 bytes but the smallest tiling (every tile 1) needs 12 bytes")


@pytest.mark.parametrize(
    "workload,match",
    [
        ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        # Files are validated by the service's schema (api/request.py), so the messages are its own.
        ('{"kind": "gemm", "dims": {"m": 0, "n": 4, "k": 4}}', "gemm.dims.m: Input should be greater than or equal to 1"),
        ('{"kind": "gemm", "dims": {"m": -2, "n": 4, "k": 4}}', "gemm.dims.m: Input should be greater than or equal to 1"),
        ('{"kind": "gemm", "dims": {"m": 4, "n": 4, "k": 4}, "dtype": "float8"}', "gemm.dtype: Input should be 'float32'"),
        ('{"kind": "conv", "dims": {"m": 4}}', "Input tag 'conv' found using 'kind' does not match any of the expected tags"),
        ('{"kind": "gemm", "dims": {"m": 4, "n": 4}}', "gemm.dims.k: Field required"),
        ('[1, 2]', "Input should be a valid dictionary or instance of Workload"),
        # Strict, as the service: a string or a boolean is not a size.
        ('{"kind": "gemm", "dims": {"m": "32", "n": 4, "k": 4}}', "gemm.dims.m: Input should be a valid integer"),
        ('{"kind": "gemm", "dims": {"m": 32, "n": true, "k": 4}}', "gemm.dims.n: Input should be a valid integer"),
        ('{"dims": {"m": "32"}, "tensors": {"A": {"dims": ["m"]}, "C": {"dims": ["m"]}}, '
         '"ops": [{"name": "o", "loops": ["m"], "inputs": ["A"], "output": "C"}]}', "extents must be integers"),
        # A tensor indexed by no loop: one line, not an IndexError.
        ('{"dims": {"m": 4}, "tensors": {"A": {"dims": []}, "C": {"dims": ["m"]}}, '
         '"ops": [{"name": "o", "loops": ["m"], "inputs": ["A"], "output": "C"}]}', "tensors.A.dims: List should have at least 1 item"),
    ],
)
def test_bad_workload_files(tmp_path, workload, match):
    bad("workload", write(tmp_path, "w.json", workload), match=match)


FULL = {
    "dims": {"m": 4, "n": 4, "k": 4},
    "tensors": {"A": {"dims": ["m", "k"]}, "B": {"dims": ["k", "n"]}, "C": {"dims": ["m", "n"]}},
    "ops": [{"name": "g", "loops": ["m", "n", "k"], "inputs": ["A", "B"], "output": "C"}],
}


@pytest.mark.parametrize(
    "patch,match",
    [
        ({"dtype": "complex64"}, "dtype: Input should be 'float32', 'float16', 'bfloat16', 'float64', 'int8' or 'int32'"),
        ({"tensors": {**FULL["tensors"], "A": {"dims": ["m", "q"]}}}, "tensor 'A' is indexed by unknown loop(s) ['q']"),
        ({"ops": FULL["ops"] * 2}, "op outputs must be unique, got ['C', 'C']"),
        ({"dims": {"m": 4, "n": 4, "k": 0}}, "dims: Value error, loop 'k' has extent 0; extents must be >= 1".replace("Value error, ", "")),
        ({"tensors": {**FULL["tensors"], "C": {"dims": ["m", "n"], "role": "input"}}}, "tensor 'C' is declared 'input' but the ops make it 'output'"),
        ({"signature": ["A", "B"]}, "signature must list each input and output tensor once: ['A', 'B', 'C']"),
    ],
)
def test_bad_full_workloads(tmp_path, patch, match):
    bad("workload", write(tmp_path, "w.json", {**FULL, **patch}), match=match)


@pytest.mark.parametrize(
    "hardware,match",
    [
        ("{", "is not valid JSON"),
        ({**CUSTOM, "levels": []}, "levels: List should have at least 1 item after validation, not 0"),
        ({**CUSTOM, "peak_flops": 0}, "peak_flops: Input should be greater than 0"),
        ({**CUSTOM, "levels": [{"name": "x", "capacity_bytes": -1, "bandwidth_bytes_per_s": 1}]}, "levels.0.capacity_bytes: Input should be greater than 0"),
        ({**CUSTOM, "levels": [CUSTOM["levels"][0]] * 2}, "level names must be unique"),
        # As strict as the service: "4096" is not a capacity.
        ({**CUSTOM, "levels": [{"name": "x", "capacity_bytes": "4096", "bandwidth_bytes_per_s": 1}]},
         "levels.0.capacity_bytes: Input should be a valid integer"),
        # A vector narrower than one element (float64 is 8 bytes): one line, not a division by zero.
        ({**CUSTOM, "vector_bytes": 4, "levels": [{**CUSTOM["levels"][0], "name": "registers"}]},
         "vector_bytes 4 of 'two-level' holds no float64 element (8 bytes)"),
    ],
)
def test_bad_hardware_files(tmp_path, hardware, match):
    bad("gemm", "--M", "4", "--N", "4", "--K", "4", "--dtype", "float64", "--hardware", write(tmp_path, "hw.json", hardware),
        match=match)


@pytest.mark.parametrize("cache", ["a-directory", "not-sqlite.db", "missing/parent/is/a/file/x.sqlite"])
def test_serve_refuses_a_cache_that_is_not_sqlite(tmp_path, cache):
    """Not started, then 500 on every request: one line and exit 2 before listening."""
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "not-sqlite.db").write_text("plans, but not a database")
    (tmp_path / "missing").write_text("a file where a folder should be")
    proc = subprocess.run([*TUNE, "serve", "--cache", str(tmp_path / cache), "--port", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"tune: error: --cache {tmp_path / cache} is not a usable SQLite plan cache: "), line


def test_double_buffering_that_changes_nothing_says_why(tmp_path):
    """gemm 256^3: every input copy is made once, at the root, so nothing is pipelined (the issue's
    512^3 now attaches A's copy to a parallel loop, which says so instead)."""
    from golden_cases import SIMD  # a fixed 2-core AVX-512 machine, so the plan is the same everywhere

    args = ["gemm", "--M", "256", "--N", "256", "--K", "256", "--export", str(tmp_path / "out"), "--double-buffer",
            "--hardware", write(tmp_path, "simd.json", SIMD)]
    doc = json.loads(tune(*args, "--json").stdout)
    copies = [c for c in doc["plan"]["caches"] if c["level"] != "registers" and not c["skipped_thrifty"]]
    assert copies and all(not c["double_buffer"] for c in copies)
    assert {c["note"] for c in copies} == {"filled once, before every loop: there is no next block to overlap"}
    text = tune(*args).stdout
    assert "double buffering changes nothing: A in L3: filled once, before every loop" in text


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("tune") or str(__import__("pathlib").Path(sys.executable).with_name("tune"))
    proc = subprocess.run([exe, "hardware"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "presets" in proc.stdout


def test_cli_does_not_import_tvm_or_pyomo_for_enumerate():
    code = (
        "import sys; from cachetile.api.cli import main; main(['gemm','--M','8','--N','8','--K','8','--solver','enumerate','--hardware','v100']);"
        "print('LOADED', sorted(m for m in ('tvm','pyomo') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "LOADED []" in out


def test_builtin_names_dims_in_row_major_order():
    w = builtin("batch-gemm", {"b": 2, "m": 3, "n": 4, "k": 5})
    assert w.tensors["A"].dims == ["b", "m", "k"] and w.signature == ["A", "B", "C"]


def test_export_and_measure_from_the_command_line(tmp_path):
    out = tmp_path / "kernel"
    doc = json.loads(tune("gemm", "--M", "64", "--N", "48", "--K", "40", "--export", str(out), "--measure",
                          "--double-buffer", "--json").stdout)
    assert sorted(p.name for p in out.iterdir()) == ["kernel.so", "plan.json", "schedule.py"]
    exported = json.loads((out / "plan.json").read_text())
    assert exported["plan"] == doc["plan"] and exported["plan"]["caches"]
    m = doc["measurement"]
    assert m["kernel_gflops"] > 0 and m["reference_gflops"] > 0 and m["reference"] == "numpy" and m["max_abs_error"] < 1e-3


def test_kernel_flags_need_a_matching_target(tmp_path):
    bad("gemm", "--M", "64", "--N", "64", "--K", "64", "--hardware", "h100", "--target", "llvm", "--export", str(tmp_path),
        match="--target llvm does not build for gpu hardware 'h100' (its backend is cuda)")
    bad("gemm", "--M", "64", "--N", "64", "--K", "64", "--target", "cuda", "--measure",
        match="--target cuda does not build for cpu hardware 'host'")


def test_export_into_a_file_path_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad("gemm", "--M", "16", "--N", "16", "--K", "16", "--export", str(blocker / "sub"), match="Not a directory")


def test_a_tvm_failure_inside_a_build_is_reported_as_build_failed(monkeypatch, capsys):
    """TVM's errors subclass RuntimeError; they must read "build failed" with TVM's own message,
    never "no plan within the time limit"."""
    from cachetile.api import cli
    from cachetile.backends import llvm_emit

    def vectorize_a_reduction(sch, nests, op, micro, *_):  # TVM refuses: k is not data parallel
        sch.vectorize(nests.loops[(op.name, (micro[0], -1))])

    monkeypatch.setattr(llvm_emit, "_micro_kernel", vectorize_a_reduction)
    status = cli.main(["gemm", "--M", "32", "--N", "32", "--K", "32", "--measure"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1
    assert err[0].startswith('tune: error: build failed: ScheduleError: The "vectorize" cannot be fulfilled'), err
    assert "not a data parallel block iter" in err[0] and "no feasible plan" not in err[0]


def test_einsum_and_conv2d_commands(tmp_path):
    doc = json.loads(tune("einsum", "bmk,bkn->bmn", "--dims", "b=2,m=16,n=32,k=8", "--hardware", "h100",
                          "--json", "--top", "0").stdout)
    assert doc["workload"]["tensors"]["C"]["dims"] == ["b", "m", "n"] and doc["workload"]["kind"] == "einsum"
    chain = json.loads(tune("einsum", "C[m,l] = A[m,k]*B[k,l]; E[m,n] = C[m,l]*D[l,n]", "--dims", "m=8,l=8,k=4,n=4",
                            "--hardware", "h100", "--json", "--top", "0").stdout)
    assert chain["workload"]["tensors"]["C"]["role"] == "intermediate"
    conv = json.loads(tune("conv2d", "--N", "1", "--C", "8", "--H", "9", "--W", "9", "--K", "4", "--R", "3", "--S", "3",
                           "--stride", "2", "--pad", "1", "--layout", "nhwc", "--hardware", "h100", "--json",
                           "--top", "0", "--export", str(tmp_path)).stdout)
    assert conv["workload"]["tensors"]["I"] == {"dims": ["n", "2*oh+kh-1", "2*ow+kw-1", "c"], "role": "input",
                                                "shape": [1, 9, 9, 8]}
    assert conv["workload"]["dims"]["oh"] == 5 and (tmp_path / "kernel.cu").exists()
    bad("einsum", "C[m,n] = A[m,k]*B[k,n", "--dims", "m=4,n=4,k=4",
        match="equation 1 'C[m,n] = A[m,k]*B[k,n': expected ']' to close B[ at column 22")
    bad("einsum", "mk,kn->mn", "--dims", "m=4,k", match="argument --dims: 'k' is not LOOP=EXTENT")
    bad("conv2d", "--N", "1", "--C", "8", "--H", "2", "--W", "9", "--R", "3", "--S", "3",
        match="conv2d: the 3x3 window with dilation 1 does not fit the 2x9 input padded by 0")
    bad("conv2d", "--N", "1", "--C", "8", "--H", "9", "--W", "9", "--R", "3", "--S", "3", "--stride", "0",
        match="argument --stride: 0 must be >= 1")
