"""receipt-client is a distribution of its own: `clients/python` builds a wheel that installs
alone in a fresh virtualenv (httpx and pydantic from the index, nothing of the server) and works
there."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from datetime import UTC, datetime
from pathlib import Path

from fastapi.encoders import jsonable_encoder

from receipts.jobs import Job
from roles.api.schema import job_view
from tests.conftest import ROOT

CHECK = """
import importlib.util, sys
from receipt_client import AsyncClient, Client, ConnectionFailed, models
assert importlib.util.find_spec("receipts") is None, "the server came along"
assert importlib.util.find_spec("roles") is None, "the server came along"
job = models.JobView.model_validate_json(sys.argv[1])
try:
    Client("http://127.0.0.1:9", "t").get_job(job.job_id)
except ConnectionFailed as exc:
    print("unreachable:", exc.message.split(":")[0])
print(AsyncClient.__name__, job.status)
"""


def test_the_client_wheel_installs_alone_in_a_fresh_venv(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist)]
    subprocess.run([*build, str(ROOT / "clients" / "python")], check=True, timeout=300)
    (wheel,) = dist.glob("receipt_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {
        "receipt_client/models/__init__.py",
        "receipt_client/aio.py",
        "receipt_client/_aio_base.py",
        "receipt_client/py.typed",
    } <= set(names)
    assert not [name for name in names if name.split("/")[0] in ("receipts", "roles")]
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)], check=True, timeout=300
    )
    now = datetime.now(UTC)
    job = Job(
        job_id="wheel-1",
        agent_id="codex",
        lane="collect",
        kind="factory.task.run",
        payload={"kind": "factory.task.run"},
        status="completed",
        created_at=now,
        updated_at=now,
    )
    shown = json.dumps(jsonable_encoder(job_view(job)))  # as the api answers it
    ran = subprocess.run(
        [str(python), "-c", CHECK, shown], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "unreachable: cannot reach the API at http",
        "AsyncClient completed",
    ]
