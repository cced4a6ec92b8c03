"""Property-based tests (hypothesis) over every front door: the CLI's argument vectors and files,
the Python API's entry points and the service's bodies. Whatever the input, the answer is a
result or one line saying what is wrong, with the status the README promises: exit 0, 1 or 2
(never an internal error), HTTP 200 or 422 (never a 500), InvalidInput for bad Python
arguments. The CLI and the service accept and reject the same workloads and hardware.

CI runs a few dozen examples per property; CACHETILE_PROPERTY_EXAMPLES raises that for a deep
run (scripts/fuzz.py runs them and schemathesis; BENCHMARKS.md records what they found).
"""
import json
import math
import os
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cachetile.api import cli
from cachetile.api.request import parse_hardware, parse_workload
from cachetile.models.costmodel import data_volume as raw_data_volume
from cachetile.models.errors import CachetileError, InvalidInput
from cachetile.models.workload import KINDS
from cachetile import builtin, data_volume, memory_usage, preset, tune

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from service_load import running_server  # noqa: E402

EXAMPLES = int(os.environ.get("CACHETILE_PROPERTY_EXAMPLES", "0")) or None
LIMIT = 0.3  # seconds per solve: generated problems of any size answer quickly


def examples(n: int):
    return settings(max_examples=EXAMPLES or n, deadline=None, derandomize=EXAMPLES is None, database=None,
                    suppress_health_check=list(HealthCheck))


def mostly(good, bad, one_in: int = 12):
    """Usually `good`, one time in `one_in` `bad`: most inputs get past validation to the solver."""
    return st.integers(1, one_in).flatmap(lambda r: bad if r == 1 else good)


# --- values a user might type or write --------------------------------------------------------
sizes = mostly(st.one_of(st.integers(1, 300), st.sampled_from([1, 2, 7, 31, 64, 97, 2**31 - 1, 10**9])),
               st.sampled_from([0, -1, -3, 2**31]))
typed_sizes = mostly(sizes.map(str), st.sampled_from(["x", "", "1e3", "3.5", "inf", "nan", "0x10", " 8"]))
json_sizes = mostly(sizes, st.sampled_from(["32", "5", True, False, None, 4.0, 2.5, [4], {"n": 4}, -0.0, 1e300]))
loops = mostly(st.sampled_from(["m", "n", "k", "l", "b"]), st.just("q"))
dtypes = mostly(st.sampled_from(["float32", "float16", "bfloat16", "float64", "int8", "int32"]),
                st.sampled_from(["float8", "", "FLOAT32"]))


@st.composite
def argv(draw):
    """A `tune` command line: a workload command, its flags (good and bad values), maybe noise."""
    command = draw(st.sampled_from([*KINDS, "pareto", "hardware"]))
    if command == "hardware":
        return ["hardware", *draw(st.lists(st.sampled_from(["h100", "host", "tpu", "--json", "x.json"]), max_size=2))]
    words = ["pareto"] if command == "pareto" else []
    kind = draw(st.sampled_from(list(KINDS))) if command == "pareto" else command
    words += [kind, "--points", "2"] if command == "pareto" else [kind]
    spec = KINDS[kind]
    for x in [*spec.loops, "b"]:
        needed = spec.batch == "required" if x == "b" else x not in spec.defaults
        if needed or draw(st.booleans()):
            words += ["--batch" if x == "b" else f"--{x.upper()}", draw(typed_sizes)]
    words += ["--time-limit", draw(mostly(st.just(str(LIMIT)), st.sampled_from(["0", "-1", "nan", "inf", "1e-9", "x"])))]
    options = {
        "--dtype": dtypes, "--hardware": mostly(st.sampled_from(["host", "h100", "a100", "v100"]), st.sampled_from(["tpu", "none.json"])),
        "--solver": mostly(st.sampled_from(["auto", "enumerate", "pyomo-ipopt", "pyomo-scip"]), st.just("magic")),
        "--top": mostly(st.sampled_from(["0", "1", "3", "100"]), st.sampled_from(["-1", "x"])),
        "--stages": mostly(st.sampled_from(["1", "2", "8"]), st.sampled_from(["9", "0"])),
        "--target": st.sampled_from(["llvm", "cuda", "rocm"]), "--arch": st.sampled_from(["sm_80", "sm_99"]),
    } if command != "pareto" else {
        "--dtype": dtypes, "--hardware": mostly(st.sampled_from(["h100", "v100"]), st.just("tpu")),
        "--level": mostly(st.sampled_from(["registers", "shared", "L2"]), st.just("L9")),
        "--points": mostly(st.sampled_from(["2", "3"]), st.sampled_from(["1", "x"])),
        "--capacities": mostly(st.sampled_from(["64,4096", "1024,65536"]), st.sampled_from(["0", "1,2,3", "x,1", ""])),
    }
    for flag in draw(st.lists(st.sampled_from(sorted(options)), max_size=3, unique=True)):
        words += [flag, draw(options[flag])]
    words += draw(st.lists(mostly(st.just("--json"), st.sampled_from(["--frob", "extra"])), max_size=2))
    return words


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """`tune` in this process; asserts the README's promise on its status and output."""
    status = cli.main(args)
    out, err = capsys.readouterr()
    event(f"exit {status}")
    assert status in (0, 1, 2), (args, status, err)
    if status:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tune: error: "), (args, err)
        assert "internal error" not in lines[0] and "Traceback" not in err, (args, err)
        assert out == "", (args, out)
    elif "--json" in args:
        json.loads(out)
    return status, out, err


@examples(40)
@given(args=argv())
def test_cli_argument_vectors(args, capsys):
    run_cli(args, capsys)


# --- files -----------------------------------------------------------------------------------
def _mutate(draw, body: dict, paths: list) -> dict:
    """The body with up to two of its values replaced by odd ones (a path is a list of keys)."""
    body = json.loads(json.dumps(body))
    for _ in range(draw(st.integers(0, 2))):
        *where, key = draw(st.sampled_from(paths))
        node = body
        for k in where:
            node = node.get(k) if isinstance(node, dict) else node[k] if isinstance(node, list) and k < len(node) else None
            if node is None:
                break
        if isinstance(node, dict) or (isinstance(node, list) and isinstance(key, int) and key < len(node)):
            node[key] = draw(st.sampled_from(ODD))
    return body


ODD = ["32", True, None, 0, -1, 2**31, 4.5, float("nan"), [], ["q"], {}, "", "m", ["m", "m"], 1e300]


MAX_SIZES = max(len(k.loops) for k in KINDS.values()) + 1  # every kind's loops and a batch


def sizes(kind: str, extents: list[int], count: int | None = None) -> dict[str, int]:
    """The first `count` (default: all) of the kind's loops and the batch, sized by `extents`; a
    window (conv2d's r, s) no larger than its input, so the sizes make a workload."""
    spec = KINDS[kind]
    names = [*spec.loops, *(["b"] if spec.batch != "none" else [])]
    dims = dict(zip(names[: len(names) if count is None else count], extents))
    for window, image in [("r", "h"), ("s", "w")] if kind == "conv2d" else []:
        dims[window] = min(dims[window], dims[image])
    return dims


@st.composite
def workload_objects(draw):
    """A built-in's short form or its full workload object, with up to two odd values."""
    kind = draw(st.sampled_from(list(KINDS)))
    extents = draw(st.lists(st.integers(1, 64), min_size=MAX_SIZES, max_size=MAX_SIZES))
    dims = sizes(kind, extents, draw(st.integers(len(KINDS[kind].loops), len(KINDS[kind].loops) + 1)))
    if KINDS[kind].batch == "required":
        dims.setdefault("b", 2)
    dtype = draw(st.sampled_from(["float32", "float16", "int8", "float64"]))
    if draw(st.booleans()):
        body = {"kind": kind, "dims": dims, "dtype": dtype}
        return _mutate(draw, body, [["kind"], ["dtype"], ["dims", "m"], ["dims", "k"], ["dims", "q"], ["dims"], ["extra"]])
    full = builtin(kind, dims, dtype).model_dump(mode="json", exclude={"kind", "signature"})
    full["tensors"] = {t: {"dims": v["dims"]} for t, v in full["tensors"].items()}
    paths = [["dims", "m"], ["dims", "k"], ["tensors", "A", "dims"], ["tensors", "A", "role"], ["tensors", "C", "dims"],
             ["ops", 0, "loops"], ["ops", 0, "inputs"], ["ops", 0, "output"], ["ops", 0, "name"], ["dtype"], ["signature"],
             ["ops", 0, "loops", 0], ["tensors", "A", "dims", 0], ["ops"], ["tensors"]]
    return _mutate(draw, full, paths)


gemm_like = st.builds(lambda m, n, k, dtype: {"kind": "gemm", "dims": {"m": m, "n": n, "k": k}, "dtype": dtype},
                      st.integers(1, 300), st.integers(1, 300), st.integers(1, 300), st.sampled_from(["float32", "float64", "int8"]))


@st.composite
def hardware_objects(draw):
    """A preset or a small custom hierarchy, as a JSON object, with up to two odd values."""
    base = draw(st.sampled_from(["host", "v100", "h100", "custom"]))
    if base == "custom":
        levels = [{"name": f"L{i}", "capacity_bytes": draw(st.integers(1, 2**22)),
                   "bandwidth_bytes_per_s": draw(st.floats(1e6, 1e13))} for i in range(draw(st.integers(1, 4)))]
        body = {"name": "custom", "levels": levels, "peak_flops": draw(st.floats(1e6, 1e15)),
                "cores": draw(st.sampled_from([1, 2, 3, 16])), "vector_bytes": draw(st.sampled_from([None, 4, 16, 48, 64]))}
    else:
        body = json.loads(preset(base).model_dump_json())
    paths = [["levels", 0, "capacity_bytes"], ["levels", 1, "capacity_bytes"], ["levels", 0, "bandwidth_bytes_per_s"],
             ["levels", 0, "name"], ["levels", 0, "ways"], ["peak_flops"], ["cores"], ["vector_bytes"], ["kind"],
             ["gpu", "warp"], ["gpu", "sms"], ["gpu", "max_threads_per_block"], ["gpu", "registers_per_sm"],
             ["gpu", "shared_per_sm_bytes"], ["levels"], ["name"], ["call_seconds"]]
    return _mutate(draw, body, paths)


@examples(30)
@given(workload=st.one_of(workload_objects(), gemm_like), wrap=st.booleans())
def test_cli_workload_files(workload, wrap, tmp_path_factory, capsys):
    path = tmp_path_factory.mktemp("w") / "w.json"
    path.write_text(json.dumps({"workload": workload} if wrap else workload))
    status, _, err = run_cli(["workload", str(path), "--hardware", "v100", "--time-limit", str(LIMIT), "--json"], capsys)
    # One schema: the file is accepted exactly when the service's validator accepts it.
    try:
        parse_workload(workload)
        assert "Input should" not in err
    except InvalidInput as exc:
        assert status == 2 and err.strip() == f"tune: error: {' '.join(str(exc).split())}"


@examples(30)
@given(hardware=hardware_objects(), workload=gemm_like)
def test_cli_hardware_files(hardware, workload, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("h")
    (folder / "hw.json").write_text(json.dumps(hardware))
    (folder / "w.json").write_text(json.dumps(workload))
    status, _, err = run_cli(["workload", str(folder / "w.json"), "--hardware", str(folder / "hw.json"),
                              "--time-limit", str(LIMIT), "--top", "1", "--json"], capsys)
    try:
        parse_hardware(hardware)
    except InvalidInput as exc:
        assert status == 2 and err.strip() == f"tune: error: {' '.join(str(exc).split())}"


# --- the Python API ----------------------------------------------------------------------------
small_workloads = st.builds(
    lambda kind, extents, dtype: builtin(kind, sizes(kind, extents), dtype),
    st.sampled_from(list(KINDS)), st.lists(st.integers(1, 12), min_size=MAX_SIZES, max_size=MAX_SIZES),
    st.sampled_from(["float32", "float16", "int8"]))
ODD_TILES = [0, -1, 0.5, 2.0, "4", None, True, np.int64(3), np.array([1, 2]), np.array([0]), 10**6]


@examples(80)
@given(w=small_workloads, levels=st.integers(1, 3), shuffle=st.randoms(use_true_random=False),
       odd=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["m", "n", "k", "l", "b", "q"]), st.sampled_from(ODD_TILES)),
                    max_size=2), short=st.integers(0, 12))
def test_cost_model_entry_points(w, levels, shuffle, odd, short):
    """Nested tiles and valid orders with up to two odd values (or a loop missing from an order):
    a finite, non-negative cost equal to the unchecked model's, or one line of InvalidInput."""
    tiles, parent = [], dict(w.dims)
    for _ in range(levels):
        parent = {x: shuffle.randint(1, e) for x, e in parent.items()}
        tiles.insert(0, parent)
    for j, x, value in odd:
        tiles[min(j, levels - 1)][x] = value
    orders = []
    for _ in tiles:
        shared, private = list(w.shared_loops), [x for x in w.dims if x not in w.shared_loops]
        shuffle.shuffle(shared)
        shuffle.shuffle(private)
        orders.append(shared + private)
    if short == 0:
        orders[0] = orders[0][:-1]
    for checked, raw in ((data_volume, raw_data_volume), (memory_usage, None)):
        args = (w, orders, tiles) if raw else (w, tiles[0])
        try:
            values = [np.asarray(v, dtype=np.float64) for v in np.atleast_1d(checked(*args))]
        except InvalidInput as exc:
            assert "\n" not in str(exc)
            event("invalid")
            continue
        event("costed")
        assert all(np.all(np.isfinite(v)) and np.all(v >= 0) for v in values)
        if raw and not any(np.ndim(v) for t in tiles for v in t.values()):  # the checks change no number
            assert [v.tolist() for v in values] == [np.asarray(v, dtype=np.float64).tolist() for v in raw(*args)]


@examples(40)
@given(w=small_workloads, hardware=st.sampled_from(["h100", "v100", "host", "host"]),
       solver=mostly(st.sampled_from(["auto", "enumerate", "pyomo-ipopt", "pyomo-scip"]), st.sampled_from(["magic", None])),
       limit=mostly(st.just(LIMIT), st.sampled_from([0, -1, float("nan"), float("inf"), "1", None])),
       top=mostly(st.sampled_from([0, 1, 3]), st.sampled_from([-1, 1.5, True])),
       stages=mostly(st.sampled_from([None, None, None, 1, 2]), st.sampled_from([9, "2"])))
def test_tune_entry_point(w, hardware, solver, limit, top, stages):
    """A result with ranked, feasible plans, or one of cachetile's errors (InvalidInput for bad arguments)."""
    try:
        result = tune(w, preset(hardware), solver, limit, top, stages)
    except CachetileError as exc:
        assert "\n" not in str(exc) and exc.kind != "internal"
        event(exc.kind)
        return
    event("plan")
    plans = [result.plan, *result.alternatives]
    assert len(plans) <= top + 1
    assert [p.predicted_seconds for p in plans] == sorted(p.predicted_seconds for p in plans)
    for p in plans:
        assert math.isfinite(p.predicted_seconds) and p.predicted_seconds > 0
        assert all(lv.mu_bytes <= lv.capacity_bytes for lv in p.levels) or hardware == "host"


# --- the service -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("props") / "plans.sqlite", "--max-time-limit", str(LIMIT),
                        "--workers", "2") as url:
        yield url


@examples(40)
@given(workload=st.one_of(workload_objects(), gemm_like),
       hardware=st.one_of(st.sampled_from(["h100", "v100", "host", "tpu", "/etc/passwd", 5]), hardware_objects()),
       extra=st.dictionaries(st.sampled_from(["solver", "top", "time_limit", "stages", "colour"]),
                             st.sampled_from(["auto", "enumerate", 0, 1, 3, -1, "3", LIMIT, 100, None, True]), max_size=2))
def test_service_plan_bodies(service, workload, hardware, extra):
    body = {"workload": workload, "hardware": hardware, **extra}
    # json.dumps writes nan and inf as NaN and Infinity, as some clients do
    r = httpx.post(f"{service}/v1/plans", content=json.dumps(body), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code in (200, 422), (body, r.status_code, r.text)
    event(f"HTTP {r.status_code}")
    doc = r.json()
    if r.status_code == 422:
        assert "\n" not in doc["detail"] and doc["detail"], doc
    else:
        assert set(doc) == {"workload", "hardware", "plan", "solver", "alternatives"}
    # One schema: a workload the CLI's files reject is rejected here with the same words.
    try:
        parse_workload(workload)
    except InvalidInput as exc:
        assert r.status_code == 422 and " ".join(str(exc).split()) in doc["detail"], (doc, exc)
