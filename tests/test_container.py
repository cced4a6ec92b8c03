"""The Dockerfile's install steps, run without a Docker engine: its COPY lines into a fresh
build context, its install script into a fresh venv, then `tune serve` from that venv."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
from service_load import free_port  # noqa: E402

ROOT = Path(__file__).parents[1]


def test_dockerfile_installs_with_the_script_and_serves_as_non_root():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim$", text, re.M)
    assert re.search(r"^RUN scripts/install\.sh /opt/cachetile\b", text, re.M)
    assert re.search(r"^USER cachetile$", text, re.M)
    assert 'CMD ["tune", "serve", "--host", "0.0.0.0", "--port", "8000"]' in text
    # Every runtime dependency is pinned to one version.
    pins = [line for line in (ROOT / "requirements.lock").read_text().splitlines() if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[^=\s]+", p) for p in pins), pins
    names = {p.split("==")[0].lower() for p in pins}
    assert {"fastapi", "uvicorn", "pydantic", "numpy", "apache-tvm"} <= names


def copy_like_docker(dest: Path) -> None:
    """Carry out the Dockerfile's COPY lines: a directory's contents, or files, into the target under dest."""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            *sources, target = line.split()[1:]
            for src in sources:
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, dest / target, dirs_exist_ok=True)
                else:
                    (dest / target).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / src, dest / target / Path(src).name)


def test_install_steps_give_a_working_server(tmp_path):
    src, venv = tmp_path / "src", tmp_path / "venv"
    copy_like_docker(src)
    assert (src / "scripts" / "install.sh").exists() and (src / "api" / "service.py").exists()
    subprocess.run(["sh", "scripts/install.sh", str(venv)], cwd=src, check=True, timeout=900, capture_output=True)
    port = free_port()
    env = {"CACHETILE_CACHE": str(tmp_path / "plans.sqlite"), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    # Run from outside the checkout, so nothing but the installed package can be imported.
    proc = subprocess.Popen([str(venv / "bin" / "tune"), "serve", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                health = httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                subprocess.run(["sleep", "0.1"])
        assert health.json()["status"] == "ok"
        body = {"workload": {"kind": "gemm", "dims": {"m": 64, "n": 64, "k": 64}}, "hardware": "v100"}
        plan = httpx.post(f"{url}/v1/plans", json=body, timeout=60)
        assert plan.status_code == 200 and plan.json()["plan"]["levels"][0]["name"] == "registers"
        assert (tmp_path / "plans.sqlite").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
