"""deploy/k8s: every overlay renders, validates against the Kubernetes schemas, and says what the
roles need (probes on their real endpoints, limits, a PDB, an HPA per worker, the security
context, every setting the code reads, and only the api reachable from outside)."""

from __future__ import annotations

import ast
import ipaddress
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from roles.infra.process import (
    CLOSE_S,
    GATEWAY_STOP_S,
    SHUTDOWN_MARGIN,
    SPANS_FLUSH_S,
    TASKS_END_S,
)
from roles.infra.settings import CALLBACK_ROLES, DEFAULT_CONCURRENCY, DEFAULT_GRACE_MS
from roles.role import ROLES, WORKER_QUEUES
from tests.deploy.render import render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = {
    "base": K8S / "base",
    "dev": K8S / "overlays" / "dev",
    "production": K8S / "overlays" / "production",
}
# The schemas shipped inside kubernetes-validate (no network): the oldest Kubernetes the
# manifests promise to run on, and the newest the package knows.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
METRICS_PORT = 9470
API_PORT = 8000

Obj = dict[str, Any]


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    return request.param, render(OVERLAYS[request.param])


def by_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


def role_deployment(objects: list[Obj], role: str) -> Obj:
    return by_kind(objects, "Deployment")[f"receipt-{role}"]


# --- rendering and schemas ---------------------------------------------------------------------


def test_every_object_validates_against_the_kubernetes_schemas(
    overlay: tuple[str, list[Obj]],
) -> None:
    _, objects = overlay
    assert objects
    for obj in objects:
        for version in KUBERNETES_VERSIONS:
            # strict: an unknown or misspelt field is an error, not silently dropped.
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_check_catches_a_misspelt_field(overlay: tuple[str, list[Obj]]) -> None:
    _, objects = overlay
    broken = yaml.safe_load(yaml.safe_dump(role_deployment(objects, "driver")))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed"
)
@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_the_python_renderer_agrees_with_kubectl_kustomize(name: str) -> None:
    output = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS[name])],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    theirs = [o for o in yaml.safe_load_all(output) if o]

    def key(o: Obj) -> tuple[str, str, str]:
        return o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]

    assert {key(o): o for o in render(OVERLAYS[name])} == {key(o): o for o in theirs}


# --- every role --------------------------------------------------------------------------------


def test_every_role_has_a_deployment_with_probes_limits_and_security(
    overlay: tuple[str, list[Obj]],
) -> None:
    _, objects = overlay
    config = by_kind(objects, "ConfigMap")["receipt-config"]["data"]
    grace_s = int(config["RECEIPT_SHUTDOWN_GRACE_MS"] or DEFAULT_GRACE_MS) / 1000
    for role in ROLES:
        deployment = role_deployment(objects, role)
        pod = pod_spec(deployment)
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["RECEIPT_PROCESS_ROLE"] == role
        assert container["args"] == ["role"]

        port = API_PORT if role == "api" else METRICS_PORT
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in (
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ):
            get = container[probe]["httpGet"]
            assert get["path"] == path, (role, probe)
            assert ports[get["port"]] == port, (role, probe)
        # Every pod, the api's too, is scraped on the port named `metrics` (RECEIPT_METRICS_PORT):
        # the PodMonitor's and the annotations' port; the api's own /metrics needs an admin token.
        assert ports["metrics"] == int(config["RECEIPT_METRICS_PORT"]) == METRICS_PORT, role
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == METRICS_PORT
        assert annotations["prometheus.io/path"] == "/metrics"

        for kind in ("requests", "limits"):
            assert set(container["resources"][kind]) == {"cpu", "memory"}, (role, kind)

        # Past the whole of a stuck shutdown: the grace, the margin, the close, the tasks' end,
        # the spans' flush (Kubernetes must not SIGKILL the process while it writes its
        # releases, or its last spans and logs); worker-codex's AI gateway's stop too.
        stuck_s = grace_s + SHUTDOWN_MARGIN.total_seconds() + CLOSE_S + TASKS_END_S + SPANS_FLUSH_S
        stuck_s += GATEWAY_STOP_S if role == "worker-codex" else 0.0
        assert pod["terminationGracePeriodSeconds"] > stuck_s, role
        assert_restricted(pod, container, role)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_workspaces_are_one_volume_wherever_worker_codex_runs_more_than_one_pod(
    overlay: str,
) -> None:
    """An objective's tasks, validate and publish share its workspace, and an agent job's
    continuation its owner's, on whichever pod takes each: with more than one worker-codex pod,
    /workspace must be one ReadWriteMany claim they all mount (an emptyDir per pod left task b on
    another pod without task a's files), and worker-chat's planner mounts the same."""
    objects = render(OVERLAYS[overlay])
    ceilings = {
        o["spec"]["scaleTargetRef"]["name"]: o["spec"]["maxReplicas"]
        for o in objects
        if o["kind"] == "HorizontalPodAutoscaler"
    }
    claims = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}

    def workspace(role: str) -> tuple[int, Obj]:
        name = f"receipt-{role}"
        deployment = next(
            o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name
        )
        pods = max(deployment["spec"].get("replicas", 1), ceilings.get(name, 1))
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        (volume,) = [v for v in volumes if v["name"] == "workspace"]
        return pods, volume

    pods, codex = workspace("worker-codex")
    if pods == 1 and "emptyDir" in codex:
        return
    claim = codex.get("persistentVolumeClaim", {}).get("claimName")
    assert claim in claims, (overlay, codex)
    assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"], (overlay, claim)
    assert workspace("worker-chat")[1] == codex, overlay


def mebibytes(quantity: str) -> int:
    """A Kubernetes memory quantity (`512Mi`, `7Gi`) in MiB."""
    units = {"Mi": 1, "Gi": 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_worker_codex_holds_its_commands_memory_within_its_own(overlay: str) -> None:
    """Its concurrent commands, each at the sandbox's memory limit, and the worker fit the pod's
    memory limit: 4 commands of 4 096 MiB in a 2 GiB pod let one command within its limit take
    the pod (the kubelet kills the container, the worker and its other jobs with it)."""
    objects = render(OVERLAYS[overlay])
    config = next(
        o for o in objects if o["kind"] == "ConfigMap" and "RECEIPT_SANDBOX_MEMORY_MB" in o["data"]
    )
    deployment = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("worker-codex")
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    limit = mebibytes(container["resources"]["limits"]["memory"])
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    concurrency = int(
        env.get("RECEIPT_RESONATE_EXECUTE_CONCURRENCY") or DEFAULT_CONCURRENCY["worker-codex"]
    )
    commands = int(config["data"]["RECEIPT_SANDBOX_MEMORY_MB"]) * concurrency
    assert commands + 1024 <= limit, (overlay, commands, limit)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_worker_chat_holds_its_planners_memory_within_its_own(overlay: str) -> None:
    """worker-chat runs the objective planner in the sandbox: at the ConfigMap's 1536 MB (sized
    for worker-codex), one planner within its limit could take a 768 MiB pod and its 16 running
    attempts. Its own limit, and the worker (256 MiB, its request), fit the pod."""
    objects = render(OVERLAYS[overlay])
    deployment = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("worker-chat")
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    resources = container["resources"]
    command = int(env["RECEIPT_SANDBOX_MEMORY_MB"])
    worker = mebibytes(resources["requests"]["memory"])
    assert command + worker <= mebibytes(resources["limits"]["memory"]), (overlay, command)


def assert_restricted(pod: Obj, container: Obj, name: str) -> None:
    """Non-root, no privilege escalation, every capability dropped, RuntimeDefault seccomp, a
    read-only root filesystem with /tmp on an emptyDir, no service-account token."""
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True, name
    assert security["runAsUser"] != 0, name
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}, name
    assert pod["automountServiceAccountToken"] is False, name
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False, name
    assert context["capabilities"]["drop"] == ["ALL"], name
    assert "add" not in context["capabilities"], name
    assert context["readOnlyRootFilesystem"] is True, name
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], name


def test_every_role_has_a_pdb_and_every_worker_an_hpa(overlay: tuple[str, list[Obj]]) -> None:
    _, objects = overlay
    pdbs = by_kind(objects, "PodDisruptionBudget")
    hpas = by_kind(objects, "HorizontalPodAutoscaler")
    for role in ROLES:
        deployment = role_deployment(objects, role)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        pdb = pdbs[f"receipt-{role}"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1
        if role in WORKER_QUEUES:
            hpa = hpas[f"receipt-{role}"]
            target = hpa["spec"]["scaleTargetRef"]
            assert (target["kind"], target["name"]) == ("Deployment", f"receipt-{role}")
            assert hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"]
            volumes = pod_spec(deployment)["volumes"]
            per_pod = any(v["name"] == "workspace" and "emptyDir" in v for v in volumes)
            if role == "worker-codex" and per_pod:
                # A workspace per pod: one pod, until one volume is shared (the test below).
                assert hpa["spec"]["maxReplicas"] == 1, role
            else:
                assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"], role
            env = {e["name"]: e.get("value") for e in pod_spec(deployment)["containers"][0]["env"]}
            assert int(env["RECEIPT_RESONATE_EXECUTE_CONCURRENCY"]) == DEFAULT_CONCURRENCY[role]
    assert set(hpas) == {f"receipt-{role}" for role in WORKER_QUEUES}


def test_the_api_service_reaches_the_api_pods(overlay: tuple[str, list[Obj]]) -> None:
    _, objects = overlay
    service = by_kind(objects, "Service")["receipt-api"]
    api = role_deployment(objects, "api")
    assert (
        service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    )
    ports = {p["name"] for p in pod_spec(api)["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_the_migration_job_runs_migrate_with_the_roles_image(
    overlay: tuple[str, list[Obj]],
) -> None:
    _, objects = overlay
    job = by_kind(objects, "Job")["receipt-migrate"]
    (container,) = pod_spec(job)["containers"]
    assert container["args"] == ["migrate"]
    assert container["image"] == pod_spec(role_deployment(objects, "api"))["containers"][0]["image"]
    assert (
        container["envFrom"]
        == pod_spec(role_deployment(objects, "api"))["containers"][0]["envFrom"]
    )
    assert_restricted(pod_spec(job), container, "migrate")


# --- settings: the ConfigMap and Secret against what the code reads ----------------------------

ENV_NAME = re.compile(r"^(RECEIPT|JOB|CODEX|FACTORY|RESONATE|OTEL)_[A-Z0-9_]*[A-Z0-9]$")
SOURCE_PACKAGES = ("receipts", "receipt_worker", "activities", "workflows", "roles")
# Modules that are not part of a deployed role: the HTTP CLI.
NOT_DEPLOYED = {
    "roles/cli/client.py",
    "roles/cli/jobs.py",
}  # (bench and chaos live in tools/, not scanned)
# Read by the code, deliberately in neither the ConfigMap nor the Secret, with the reason.
NOT_IN_CONFIG = {
    "RECEIPT_PROVIDERS_FILE": "the AI gateway's providers (worker-codex): a file the operator "
    "mounts with the Secret its credentials' keys come from (README, 'The AI gateway')",
    "RECEIPT_DATA_DIR": "the embedded PostgreSQL's data directory (the `local` extra only)",
    "RECEIPT_EVENT_LOOP": "its default differs per role (uvloop; asyncio for worker-codex)",
    "RECEIPT_API_TOKENS_FILE": "an alternative to RECEIPT_API_TOKENS (mount the Secret as a file)",
    "RECEIPT_API_TOKEN": "the `receipt` CLI's own token (roles/cli/up.py names it to withhold it)",
    "RECEIPT_ORGANIZATION_ID": "the `receipt objectives run` CLI's default organization",
}
# Set in each Deployment's env because the value differs per role (worker-chat's sandbox memory
# overrides the ConfigMap's, sized for worker-codex).
PER_ROLE = {
    "RECEIPT_PROCESS_ROLE",
    "RECEIPT_DB_POOL_MAX",
    "RECEIPT_RESONATE_EXECUTE_CONCURRENCY",
    "RECEIPT_SANDBOX_MEMORY_MB",
}
# In the ConfigMap, read by libpq rather than by our code.
READ_BY_LIBPQ = {"PGSSLMODE", "PGSSLROOTCERT"}


def env_names_read_by_the_code() -> set[str]:
    """Every environment variable name in the deployed code: string constants of the settings'
    shape, with constant concatenations (`prefix + "INTERVAL_MS"`) folded, `__all__` skipped."""
    names: set[str] = set()
    for package in SOURCE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.relative_to(ROOT).as_posix() in NOT_DEPLOYED:
                continue
            names |= _env_names(ast.parse(path.read_text()))
    return names


def _env_names(tree: ast.AST) -> set[str]:
    constants: dict[str, str] = {}
    skipped: set[int] = set()
    # f-strings inside `for name in ("a", "b"): f"PREFIX_{name.upper()}"` loops.
    loop_values: dict[int, tuple[str, list[str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    constants[target.id] = node.value.value
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            skipped |= {id(n) for n in ast.walk(node.value)}
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, ast.Tuple | ast.List)
            and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.iter.elts
            )
        ):
            values = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
            for inner in ast.walk(node):
                if isinstance(inner, ast.JoinedStr):
                    loop_values[id(inner)] = (node.target.id, values)

    def fold(node: ast.AST, bound: dict[str, str] | None = None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return (bound or {}).get(node.id, constants.get(node.id))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = fold(node.left, bound), fold(node.right, bound)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.FormattedValue):
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                base = fold(value.func.value, bound)
                if base is not None and value.func.attr in ("upper", "lower") and not value.args:
                    return base.upper() if value.func.attr == "upper" else base.lower()
                return None
            return fold(value, bound)
        if isinstance(node, ast.JoinedStr):
            parts = [fold(part, bound) for part in node.values]
            return "".join(p for p in parts if p is not None) if None not in parts else None
        return None

    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.JoinedStr):
            variable, values = loop_values.get(id(node), ("", [""]))
            expansions = [fold(node, {variable: v}) for v in values]
            head = node.values[0] if node.values else None
            prefix = head.value if isinstance(head, ast.Constant) else ""
            if isinstance(prefix, str) and ENV_NAME.match(prefix + "X") and None in expansions:
                raise AssertionError(
                    f"an environment variable name the scan cannot resolve: {ast.unparse(node)}"
                )
            found |= {v for v in expansions if v is not None and ENV_NAME.match(v)}
            continue
        value = fold(node) if isinstance(node, ast.Constant | ast.BinOp) else None
        if value is not None and ENV_NAME.match(value):
            found.add(value)
    return found


def test_the_scan_finds_names_built_from_a_prefix() -> None:
    names = env_names_read_by_the_code()
    assert "RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS" in names  # prefix + "MIN_AGE_MS"
    assert "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT" in names
    assert "RECEIPT_TEMPORAL_TLS_CERT" in names  # a pydantic alias
    assert "CODEX_AGENT_ID" not in names  # in timing.py's __all__, not an environment variable
    assert "RECEIPT_SANDBOX_MEMORY_MB" in names  # an alias of the sandbox limits' settings


def configured_names(objects: list[Obj]) -> tuple[set[str], set[str], set[str]]:
    config = set(by_kind(objects, "ConfigMap")["receipt-config"]["data"])
    secret = set(by_kind(OVERLAY_BASE, "Secret")["receipt-secrets"]["stringData"])
    per_role: set[str] = set()
    for role in ROLES:
        (container,) = pod_spec(role_deployment(objects, role))["containers"]
        per_role |= {e["name"] for e in container.get("env", []) if "value" in e}
    return config, secret, per_role


def secret_names_of(container: Obj) -> set[str]:
    """The receipt-secrets keys a container gets: all by envFrom, or the ones it picks."""
    names: set[str] = set()
    secret = set(by_kind(OVERLAY_BASE, "Secret")["receipt-secrets"]["stringData"])
    for source in container.get("envFrom", []):
        if source.get("secretRef", {}).get("name") == "receipt-secrets":
            names |= secret
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == "receipt-secrets" and ref["key"] == entry["name"], entry
            assert ref["key"] in secret, entry
            names.add(ref["key"])
    return names


def test_worker_codex_gets_only_the_secrets_it_uses(overlay: tuple[str, list[Obj]]) -> None:
    """Its commands share the pod: no API token and no callback secret in its environment."""
    _, objects = overlay
    (container,) = pod_spec(role_deployment(objects, "worker-codex"))["containers"]
    assert secret_names_of(container) == {
        "RECEIPT_DATABASE_URL",
        "RECEIPT_DATABASE_DIRECT_URL",  # beside a transaction pooler only (optional)
        "RECEIPT_TEMPORAL_API_KEY",
    }
    for role in ROLES:
        (other,) = pod_spec(role_deployment(objects, role))["containers"]
        assert "RECEIPT_DATABASE_URL" in secret_names_of(other), role


OVERLAY_BASE = render(OVERLAYS["base"])


def test_every_variable_the_code_reads_is_configured(overlay: tuple[str, list[Obj]]) -> None:
    _, objects = overlay
    config, secret, per_role = configured_names(objects)
    missing = env_names_read_by_the_code() - config - secret - per_role - set(NOT_IN_CONFIG)
    assert not missing, f"read by the code but in neither ConfigMap nor Secret: {sorted(missing)}"
    assert per_role == PER_ROLE


def test_every_configured_variable_is_read_by_the_code(overlay: tuple[str, list[Obj]]) -> None:
    _, objects = overlay
    config, secret, per_role = configured_names(objects)
    read = env_names_read_by_the_code()
    unknown = (config | secret | per_role) - read - READ_BY_LIBPQ
    assert not unknown, f"configured but read by nothing: {sorted(unknown)}"
    assert not (config & secret), "a variable in both the ConfigMap and the Secret"
    assert set(NOT_IN_CONFIG) <= read, "an exemption for a variable the code no longer reads"


def test_secrets_are_not_in_the_configmap(overlay: tuple[str, list[Obj]]) -> None:
    _, objects = overlay
    config, _, _ = configured_names(objects)
    for name in config:
        assert not re.search(r"TOKEN|SECRET|PASSWORD|API_KEY|DATABASE_URL", name), name


def test_the_configmap_holds_the_spec_defaults() -> None:
    data = by_kind(OVERLAY_BASE, "ConfigMap")["receipt-config"]["data"]
    assert data["JOB_LEASE_MS"] == "300000"
    assert data["CODEX_JOB_LEASE_MS"] == "900000"
    assert data["FACTORY_CONTROL_JOB_LEASE_MS"] == "900000"
    assert data["RECEIPT_RESONATE_ACTIVE_STALE_MS"] == "600000"
    assert data["RECEIPT_SHUTDOWN_GRACE_MS"] == str(DEFAULT_GRACE_MS)
    assert data["RECEIPT_DELIVERIES_PER_ATTEMPT"] == "2"
    assert data["RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS"] == "15000"
    assert data["RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS"] == "30000"
    assert data["RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS"] == "15000"
    assert data["RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON"] == "* * * * *"
    assert data["RESONATE_STARTUP_SETTLE_MS"] == "1000"


def test_the_roles_load_their_settings_from_the_rendered_configmap(
    overlay: tuple[str, list[Obj]],
) -> None:
    """The values parse: every concern's settings load from them, as a role loads them at start,
    and every duration the ConfigMap sets is a variable one of them reads (so it was checked)."""
    from receipts.settings import variables
    from roles.infra.settings import concerns, load

    _, objects = overlay
    env = dict(by_kind(objects, "ConfigMap")["receipt-config"]["data"])
    env.update(
        {
            k: v or ""
            for k, v in by_kind(OVERLAY_BASE, "Secret")["receipt-secrets"]["stringData"].items()
        }
    )
    secret = by_kind(objects, "Secret").get("receipt-secrets")
    if secret:
        env.update(secret["stringData"])
    load(env)
    known = {name for _, model in concerns() for name in variables(model).values()}
    durations = {name for name, value in env.items() if name.endswith("_MS") and value}
    assert durations <= known, durations - known


# --- network policies --------------------------------------------------------------------------


def _selects(policy: Obj, labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return wanted.items() <= labels.items()


def _pod_labels(objects: list[Obj]) -> dict[str, dict[str, str]]:
    pods = {}
    for kind in ("Deployment", "StatefulSet", "Job"):
        for name, obj in by_kind(objects, kind).items():
            pods[name] = obj["spec"]["template"]["metadata"]["labels"]
    return pods


def _peers_from_outside(rule: Obj) -> bool:
    """Whether an ingress rule admits anything outside the namespace."""
    peers = rule.get("from")
    if not peers:
        return True
    return any("ipBlock" in p or "namespaceSelector" in p for p in peers)


def _ports(rule: Obj) -> set[int]:
    return {p["port"] for p in rule.get("ports", [])}


def test_only_the_api_is_reachable_from_outside_the_namespace(
    overlay: tuple[str, list[Obj]],
) -> None:
    _, objects = overlay
    policies = by_kind(objects, "NetworkPolicy")
    deny = policies["receipt-default-deny"]
    assert deny["spec"]["podSelector"] == {}
    assert set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    for pod, labels in _pod_labels(objects).items():
        for policy in policies.values():
            if not _selects(policy, labels):
                continue
            for rule in policy["spec"].get("ingress", []):
                if not _peers_from_outside(rule):
                    continue
                if pod == "receipt-api":
                    assert _ports(rule) <= {API_PORT, METRICS_PORT}
                    continue
                # Anything else admits only the monitoring namespace, only on metrics ports.
                assert rule.get("from"), (pod, policy["metadata"]["name"])
                for peer in rule["from"]:
                    assert "ipBlock" not in peer, (pod, policy["metadata"]["name"])
                    assert peer["namespaceSelector"] == {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                    }
                assert _ports(rule) == {METRICS_PORT}, pod


PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


def _egress_rules(objects: list[Obj], labels: dict[str, str]) -> Iterator[Obj]:
    for policy in by_kind(objects, "NetworkPolicy").values():
        if _selects(policy, labels) and "Egress" in policy["spec"]["policyTypes"]:
            yield from policy["spec"].get("egress", [])


def test_worker_codex_reaches_postgresql_only_as_the_worker_needs(
    overlay: tuple[str, list[Obj]],
) -> None:
    """Every egress rule of worker-codex's pod (which its commands share) that reaches a
    private address is a rule to the datastores on their ports or DNS; the broad rule for the
    commands excludes every private range."""
    _, objects = overlay
    labels = _pod_labels(objects)["receipt-worker-codex"]
    rules = list(_egress_rules(objects, labels))
    assert rules
    for rule in rules:
        ports = _ports(rule)
        blocks = [p["ipBlock"] for p in rule.get("to", []) if "ipBlock" in p]
        broad = [b for b in blocks if ipaddress.ip_network(b["cidr"]).prefixlen == 0]
        if broad:
            for block in broad:
                excepted = [ipaddress.ip_network(e) for e in block.get("except", [])]
                assert all(any(p.subnet_of(e) for e in excepted) for p in PRIVATE), block
            continue
        assert ports and ports <= {53, 5432, 7233}, rule


def test_the_roles_have_no_other_egress_into_the_cluster(overlay: tuple[str, list[Obj]]) -> None:
    """Only the roles that post callbacks and webhooks (`CALLBACK_ROLES`: the driver) may reach
    addresses outside; the others, whose loops would otherwise try and fail against the policy
    (a recovered callback given up after five refused posts), reach only the datastores."""
    _, objects = overlay
    assert [r for r in ROLES if r in CALLBACK_ROLES] == ["driver"]
    for role in ("api", "worker-chat", "worker-control"):
        labels = _pod_labels(objects)[f"receipt-{role}"]
        for rule in _egress_rules(objects, labels):
            assert _ports(rule) and _ports(rule) <= {53, 5432, 7233}, (role, rule)


# --- the overlays ------------------------------------------------------------------------------


def test_dev_runs_temporal_with_its_ui_and_a_postgres_statefulset() -> None:
    objects = render(OVERLAYS["dev"])
    config = by_kind(objects, "ConfigMap")["receipt-config"]["data"]
    services = by_kind(objects, "Service")
    host, port = config["RECEIPT_TEMPORAL_ADDRESS"].split(":")
    assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
    assert {p["name"] for p in services[host]["spec"]["ports"]} >= {"grpc", "ui"}
    args = pod_spec(by_kind(objects, "Deployment")["temporal"])["containers"][0]["args"]
    assert args[:2] == ["server", "start-dev"] and "--headless" not in args
    from workflows.driver import SEARCH_ATTRIBUTES

    for key in SEARCH_ATTRIBUTES:
        assert f"{key.name}=Keyword" in args
    postgres = by_kind(objects, "StatefulSet")["receipt-postgres"]
    assert postgres["spec"]["volumeClaimTemplates"]
    url = by_kind(objects, "Secret")["receipt-secrets"]["stringData"]["RECEIPT_DATABASE_URL"]
    assert re.match(r"postgresql://receipt:[^@]+@receipt-postgres:5432/receipt$", url)
    assert all(
        o["metadata"].get("namespace") == "receipt-dev" for o in objects if o["kind"] != "Namespace"
    )


def test_production_uses_mtls_a_verified_database_and_replicas() -> None:
    objects = render(OVERLAYS["production"])
    config = by_kind(objects, "ConfigMap")["receipt-config"]["data"]
    assert "receipt-secrets" not in by_kind(objects, "Secret"), "the operator's Secret, not ours"
    assert config["PGSSLMODE"] == "verify-full"
    for role in ROLES:
        deployment = role_deployment(objects, role)
        pod = pod_spec(deployment)
        mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for variable in (
            "RECEIPT_TEMPORAL_TLS_CERT",
            "RECEIPT_TEMPORAL_TLS_KEY",
            "RECEIPT_TEMPORAL_TLS_CA",
            "PGSSLROOTCERT",
        ):
            path = Path(config[variable])
            mount = mounts[str(path.parent)]
            assert mount["readOnly"] is True
            assert "secret" in volumes[mount["name"]], variable
        assert deployment["spec"]["replicas"] >= 2, role
    hpas = by_kind(objects, "HorizontalPodAutoscaler")
    for role in WORKER_QUEUES:
        assert (
            hpas[f"receipt-{role}"]["spec"]["minReplicas"]
            == role_deployment(objects, role)["spec"]["replicas"]
        )
    assert not config["RECEIPT_TEMPORAL_ADDRESS"].startswith("temporal:")
    # Commands stay confined (bwrap) in production; only the dev overlay runs them unconfined.
    assert config["RECEIPT_CODEX_SANDBOX"] == "bwrap"
    assert (
        by_kind(OVERLAY_BASE, "ConfigMap")["receipt-config"]["data"]["RECEIPT_CODEX_SANDBOX"]
        == "bwrap"
    )
    assert config["RECEIPT_WORKSPACE_ROOT"] == "/workspace"
    namespace = by_kind(objects, "Namespace")["receipt"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_production_connections_at_the_hpa_ceilings_are_as_documented() -> None:
    """Each process holds its pool (RECEIPT_DB_POOL_MAX) plus one LISTEN connection; at the
    HPA ceilings that is the figure docs/operations.md and overlays/production/hpa.yaml give."""
    objects = render(OVERLAYS["production"])
    hpas = by_kind(objects, "HorizontalPodAutoscaler")
    total = 0
    for role in ROLES:
        deployment = role_deployment(objects, role)
        env = {e["name"]: e.get("value") for e in pod_spec(deployment)["containers"][0]["env"]}
        hpa = hpas.get(f"receipt-{role}")
        pods = hpa["spec"]["maxReplicas"] if hpa else deployment["spec"]["replicas"]
        total += pods * (int(env["RECEIPT_DB_POOL_MAX"]) + 1)
    assert total == 294
    assert "= 294" in (K8S / "overlays/production/hpa.yaml").read_text()
    assert "294" in (ROOT / "docs" / "operations.md").read_text()


def test_the_migrate_first_selector_of_the_readme_picks_the_job_and_its_config() -> None:
    """deploy/README.md applies everything but the roles first, waits for the Job, then the rest."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    selector = (
        r"-l 'app\.kubernetes\.io/part-of=receipt,app\.kubernetes\.io/component notin \(([^)]*)\)'"
    )
    match = re.search(selector, readme)
    assert match, "the selector is no longer in deploy/README.md"
    excluded = {name.strip() for name in match.group(1).split(",")}
    assert excluded == set(ROLES)
    picked = [
        o
        for o in render(OVERLAYS["production"])
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "receipt"
        and o["metadata"]["labels"].get("app.kubernetes.io/component") not in excluded
    ]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in picked}
    assert ("Job", "receipt-migrate") in kinds and ("ConfigMap", "receipt-config") in kinds
    assert ("ServiceAccount", "receipt") in kinds
    assert not any(kind == "Deployment" for kind, _ in kinds)


# The OTLP/HTTP port the exporter posts spans to when OTEL_EXPORTER_OTLP_ENDPOINT names none.
OTLP_HTTP_PORT = 4318


def test_the_configmap_says_the_policies_block_an_otlp_collector() -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT is offered in the ConfigMap, but no egress rule of the api,
    worker-chat or worker-control reaches a collector (only DNS, PostgreSQL and Temporal), so
    setting it alone loses every span: where the variable is offered, the ConfigMap and
    deploy/README.md say which policy to add."""
    objects = OVERLAY_BASE
    for role in ("api", "worker-chat", "worker-control"):
        labels = _pod_labels(objects)[f"receipt-{role}"]
        assert all(OTLP_HTTP_PORT not in _ports(rule) for rule in _egress_rules(objects, labels)), (
            role
        )
    text = (K8S / "base" / "configmap.yaml").read_text()
    comment = text[: text.index("  OTEL_EXPORTER_OTLP_ENDPOINT:")].rsplit("\n\n", 1)[-1]
    above = [line for line in comment.splitlines()[-4:] if line.strip().startswith("#")]
    assert any("NetworkPolicy" in line for line in above), above
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert re.search(r"OTEL_EXPORTER_OTLP_ENDPOINT[^\n]*\n?[^\n]*NetworkPolic", readme)
