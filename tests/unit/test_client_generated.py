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
