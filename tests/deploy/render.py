"""A renderer of the kustomize subset deploy/k8s uses, so the tests need no kustomize binary.

No PyPI package ships kustomize for this Python, so this renders what the kustomizations in
deploy/k8s use and refuses anything else (an unknown kustomization field, patch shape or target
field raises `Unsupported`), so a manifest change that needs more cannot pass silently:

- `resources`: files (multi-document YAML) and directories holding a kustomization.yaml;
- `namespace`: set on every namespaced object (and as the name of a Namespace object);
- `patches`: `path` or inline `patch`, optional `target` (`kind`, `name`, `labelSelector` with
  `k=v` terms); a patch that is a YAML list is a JSON patch (RFC 6902: add, replace, remove),
  otherwise a strategic merge patch (maps merge, `$patch: delete` removes the object, lists of
  containers/volumes/env/ports/volumeMounts merge by their key, any other list is replaced);
- `replicas` (`name`, `count`) and `images` (`name`, `newName`, `newTag`).

Where kubectl is installed, tests/deploy/test_manifests.py also renders with `kubectl
kustomize` and requires the same objects.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

SCALABLE = {"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}
KNOWN_FIELDS = {"apiVersion", "kind", "resources", "namespace", "patches", "replicas", "images"}
# Strategic-merge keys of the lists the manifests patch (Kubernetes' patchMergeKey).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "envFrom": None,
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


class Unsupported(ValueError):
    """The kustomization uses something this renderer does not implement."""


def render(directory: Path) -> list[Obj]:
    """Render the kustomization in `directory` into a list of objects."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise Unsupported(f"{directory}: kustomization fields not supported: {sorted(unknown)}")
    objects: list[Obj] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [o for o in yaml.safe_load_all(path.read_text()) if o]
    for patch_entry in kustomization.get("patches", []):
        objects = _apply_patch(directory, patch_entry, objects)
    for replica in kustomization.get("replicas", []):
        matched = [
            o for o in objects if o["kind"] in SCALABLE and o["metadata"]["name"] == replica["name"]
        ]
        if not matched:
            raise Unsupported(f"replicas: no object named {replica['name']}")
        for obj in matched:
            obj["spec"]["replicas"] = replica["count"]
    for image in kustomization.get("images", []):
        for obj in objects:
            _set_image(obj, image)
    namespace = kustomization.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] == "Namespace":
                obj["metadata"]["name"] = namespace
            elif obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    return objects


def _apply_patch(directory: Path, entry: Obj, objects: list[Obj]) -> list[Obj]:
    unknown = set(entry) - {"path", "patch", "target"}
    if unknown:
        raise Unsupported(f"patch fields not supported: {sorted(unknown)}")
    text = (directory / entry["path"]).read_text() if "path" in entry else entry["patch"]
    documents = [d for d in yaml.safe_load_all(text) if d is not None]
    target = entry.get("target")
    if len(documents) == 1 and isinstance(documents[0], list):
        if target is None:
            raise Unsupported("a JSON patch needs a target")
        matched = [o for o in objects if _matches(o, target)]
        if not matched:
            raise Unsupported(f"patch target matched nothing: {target}")
        for obj in matched:
            for operation in documents[0]:
                _json_patch(obj, operation)
        return objects
    for patch in documents:
        if target is not None:
            raise Unsupported("a strategic merge patch with a target")
        kind, name = patch["kind"], patch["metadata"]["name"]
        index = next(
            (
                i
                for i, o in enumerate(objects)
                if o["kind"] == kind and o["metadata"]["name"] == name
            ),
            None,
        )
        if index is None:
            raise Unsupported(f"patch for {kind}/{name}: no such object")
        if patch.get("$patch") == "delete":
            del objects[index]
            continue
        objects[index] = _merge(objects[index], patch)
    return objects


def _matches(obj: Obj, target: Obj) -> bool:
    unknown = set(target) - {"kind", "name", "labelSelector"}
    if unknown:
        raise Unsupported(f"target fields not supported: {sorted(unknown)}")
    if "kind" in target and obj["kind"] != target["kind"]:
        return False
    if "name" in target and obj["metadata"]["name"] != target["name"]:
        return False
    labels = obj["metadata"].get("labels", {})
    for term in filter(None, target.get("labelSelector", "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and MERGE_KEYS.get(field):
        key = MERGE_KEYS[field]
        merged_list = [copy.deepcopy(item) for item in base]
        for item in patch:
            at = next((i for i, b in enumerate(merged_list) if b.get(key) == item.get(key)), None)
            if at is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[at] = _merge(merged_list[at], item)
        return merged_list
    return copy.deepcopy(patch)


def _json_patch(obj: Obj, operation: Obj) -> None:
    op, path = operation["op"], operation["path"]
    if op not in ("add", "replace", "remove"):
        raise Unsupported(f"JSON patch op {op!r}")
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    parent: Any = obj
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(parent, list):
        if op == "add":
            parent.insert(len(parent) if last == "-" else int(last), value)
        elif op == "replace":
            parent[int(last)] = value
        else:
            del parent[int(last)]
    elif op == "remove":
        del parent[last]
    else:
        parent[last] = value


def _set_image(obj: Obj, image: Obj) -> None:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {})
    for group in ("containers", "initContainers"):
        for container in pod.get(group, []) if isinstance(pod, dict) else []:
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                new_name = image.get("newName", name)
                new_tag = image.get("newTag", tag)
                container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name
