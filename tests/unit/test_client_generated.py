"""The client package (clients/python) against the api it calls: its OpenAPI document, its
models and its async client are what `make client` writes now, and it imports nothing of the
server."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tools import client_models

PACKAGE = Path(client_models.CLIENT) / "receipt_client"
ALLOWED_IMPORTS = {"httpx", "pydantic", "receipt_client", "__future__"}


def test_the_document_models_and_async_client_are_current() -> None:
    """Fails when a route or schema changed without `make client` (or aio.py was edited by hand
    instead of sync.py)."""
    assert client_models.main(["--check"]) == 0


def test_the_async_client_has_every_method_of_the_blocking_one() -> None:
    def methods(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        return {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    renamed = {"__enter__": "__aenter__", "__exit__": "__aexit__"}
    for blocking, asyncio in (("sync.py", "aio.py"), ("_sync_base.py", "_aio_base.py")):
        sync, aio = methods(PACKAGE / blocking), methods(PACKAGE / asyncio)
        assert {renamed.get(name, name) for name in sync} == aio


def test_the_client_imports_only_httpx_pydantic_and_the_standard_library() -> None:
    """PyYAML, the `yaml` extra, only inside the function that reads a YAML file: a client
    installed without it imports and works on dicts and JSON."""
    stdlib = set(sys.stdlib_module_names)
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                assert "yaml" not in ast.unparse(node), f"{path.name} imports PyYAML at the top"
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                allowed = top in stdlib or top in ALLOWED_IMPORTS or top == "yaml"
                assert allowed, f"{path.name} imports {name}"


def test_every_generated_model_is_complete_across_its_parts() -> None:
    """The models are one generated module cut in parts (tools/client_models.py): each model
    finds every model it names, so none is left half-defined by the cut."""
    from pydantic import BaseModel

    from receipt_client import models

    generated = [
        cls
        for cls in vars(models).values()
        if isinstance(cls, type)
        and issubclass(cls, BaseModel)
        and cls.__module__.startswith("receipt_client.models.")
    ]
    assert len(generated) > 50
    for cls in generated:
        cls.model_rebuild()
        assert cls.__pydantic_complete__, cls.__name__


def test_a_field_the_api_always_sends_is_not_typed_optional() -> None:
    """A field with a default that is not null (`JobView.attempt`, `.status`, `.maxAttempts`, an
    agent job's `turn`, ...) is always in the API's answers and never null: typed `int | None`
    it made every caller's mypy refuse `job.attempt + 1` and narrow `job.status` for nothing."""
    import json
    import types

    from receipt_client import models

    document = json.loads(client_models.DOCUMENT.read_text(encoding="utf-8"))
    loose = []
    for name, schema in document["components"]["schemas"].items():
        model = getattr(models, name, None)
        if model is None:
            continue
        by_alias = {field.alias or key: field for key, field in model.model_fields.items()}
        for prop, spec in schema.get("properties", {}).items():
            nullable = spec.get("type") == "null" or any(
                part.get("type") == "null" for part in spec.get("anyOf", [])
            )
            if spec.get("default") is None or nullable or prop not in by_alias:
                continue
            annotation = by_alias[prop].annotation
            if isinstance(annotation, types.UnionType) and type(None) in annotation.__args__:
                loose.append(f"{name}.{prop}")
    assert loose == []


def test_a_parameter_with_a_fixed_vocabulary_is_typed_by_it() -> None:
    """`list_jobs(status="succeeded")` (an agent job's word, not a job's) type-checked and was
    refused only at run time (422): each parameter the API takes from a fixed list is a
    `Literal` of that list, the OpenAPI document's, in both clients."""
    import json
    import typing

    from receipt_client import AsyncClient, Client

    document = json.loads(client_models.DOCUMENT.read_text(encoding="utf-8"))
    schemas = document["components"]["schemas"]

    def query_enum(path: str, name: str) -> set[str]:
        (parameter,) = [
            p for p in document["paths"][path]["get"]["parameters"] if p["name"] == name
        ]
        return set(parameter["schema"]["enum"])

    def body_enum(schema: str, name: str) -> set[str]:
        spec = schemas[schema]["properties"][name]
        return set(next(part for part in [spec, *spec.get("anyOf", [])] if "enum" in part)["enum"])

    expected = {
        ("list_jobs", "status"): query_enum("/jobs", "status"),
        ("list_jobs", "lane"): query_enum("/jobs", "lane"),
        ("list_objectives", "status"): query_enum("/objectives", "status"),
        ("session_agent_jobs", "status"): query_enum("/sessions/{sessionId}/agent-jobs", "status"),
        ("console_agent_jobs", "status"): query_enum("/console/agent-jobs", "status"),
        ("enqueue", "lane"): body_enum("EnqueueBody", "lane"),
        ("enqueue", "singleton_mode"): body_enum("EnqueueBody", "singletonMode"),
        ("command", "type"): body_enum("CommandBody", "type"),
    }
    for client in (Client, AsyncClient):
        for (method, parameter), words in expected.items():
            hint = typing.get_type_hints(getattr(client, method))[parameter]
            union = typing.get_origin(hint) is not typing.Literal
            literals = (
                [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
            )
            assert len(literals) == 1 and typing.get_origin(literals[0]) is typing.Literal, (
                f"{client.__name__}.{method}({parameter}): {hint}"
            )
            assert set(typing.get_args(literals[0])) == words, (client.__name__, method)
