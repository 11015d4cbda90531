"""Regenerate the Python client's models from the API's OpenAPI document (`make client`).

Writes `clients/python/openapi.json` (the document the api publishes, for any other generator),
`clients/python/receipt_client/models/` (datamodel-code-generator's pydantic models of it, in
parts of about 400 lines), and `clients/python/receipt_client/aio.py` and `_aio_base.py`
(`AsyncClient` and its transport, rewritten from `Client` in `sync.py` and `_sync_base.py`, so
the two clients are one text). `--check` writes nothing and exits 1 when any differs from what
it would write now (tests/unit/test_client_generated.py runs it).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from roles.api.app import create_app
from roles.api.settings import ApiSettings
from roles.infra.settings import RuntimeSettings

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients" / "python"
DOCUMENT = CLIENT / "openapi.json"
MODELS = CLIENT / "receipt_client" / "models"
SPLIT_LINES = 400
SYNC = CLIENT / "receipt_client" / "sync.py"
ASYNC = CLIENT / "receipt_client" / "aio.py"
SYNC_BASE = CLIENT / "receipt_client" / "_sync_base.py"
ASYNC_BASE = CLIENT / "receipt_client" / "_aio_base.py"
HEADER = (
    "# The API's schemas as pydantic models, generated from clients/python/openapi.json by\n"
    "# `make client` (tools/client_models.py, datamodel-code-generator): do not edit by hand."
)
# Responses keep what a newer api adds (extra="allow"): a client never breaks on a new field.
# A field with a default that is not null is not typed Optional (--strict-nullable): the api
# always sends it (`JobView.attempt` is an `int`, not `int | None`, to a caller's mypy).
OPTIONS = (
    "--input-file-type=openapi",
    "--strict-nullable",
    "--output-model-type=pydantic_v2.BaseModel",
    "--target-python-version=3.11",
    "--disable-timestamp",
    "--use-standard-collections",
    "--use-union-operator",
    "--snake-case-field",
    "--allow-population-by-field-name",
    "--field-constraints",
    "--enum-field-as-literal=all",
    "--use-schema-description",
    "--use-field-description",
    "--use-double-quotes",
    "--collapse-root-models",
    "--extra-fields=allow",
    "--formatters",
    "ruff-format",
)


def document() -> dict[str, Any]:
    """The OpenAPI document the api publishes (its routes do not depend on the settings)."""
    settings = RuntimeSettings(api=ApiSettings.model_validate({"RECEIPT_API_TOKENS": "t *"}))
    return create_app(settings).openapi()


def document_text() -> str:
    return json.dumps(document(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def models_of(text: str) -> str:
    """datamodel-code-generator's models of the document `text`."""
    with tempfile.TemporaryDirectory() as tmp:
        source, output = Path(tmp) / "openapi.json", Path(tmp) / "models.py"
        source.write_text(text, encoding="utf-8")
        codegen = Path(sysconfig.get_path("scripts")) / "datamodel-codegen"
        subprocess.run(
            [
                str(codegen),
                "--input",
                str(source),
                "--output",
                str(output),
                "--custom-file-header",
                HEADER,
                *OPTIONS,
            ],
            check=True,
            capture_output=True,
            cwd=tmp,
        )
        return output.read_text(encoding="utf-8")


# The blocking modules the asyncio ones are rewritten from, and each one's docstring.
ASYNC_OF: dict[Path, tuple[Path, str]] = {
    SYNC_BASE: (
        ASYNC_BASE,
        '"""`AsyncBaseClient`: the transport under `AsyncClient`. Generated from `_sync_base.py` '
        'by\n`make client` (tools/client_models.py): do not edit by hand."""',
    ),
    SYNC: (
        ASYNC,
        '"""`AsyncClient`: the Receipt API from asyncio code. Generated from `sync.py` by `make '
        'client`\n(tools/client_models.py): do not edit by hand."""',
    ),
}
# `Client` → `AsyncClient`: each rule a regular expression and its replacement, applied in order
# to each module of ASYNC_OF; each must match in one of them at least.
ASYNC_RULES: tuple[tuple[str, str], ...] = (
    (r'\A""".*?"""', "DOCSTRING"),
    (r"^import time$", "import asyncio"),
    (r"\bBaseClient\b", "AsyncBaseClient"),
    (r"receipt_client\._sync_base\b", "receipt_client._aio_base"),
    (r"\bIterator\[", "AsyncIterator["),
    (r"import Iterator, Mapping", "import AsyncIterator, Mapping"),
    (r"\bparse_sse\b", "parse_sse_async"),
    (r"response\.iter_lines\(\)", "response.aiter_lines()"),
    (r"class Client\(", "class AsyncClient("),
    (r"A blocking client", "An asyncio client"),
    (r"httpx\.BaseTransport", "httpx.AsyncBaseTransport"),
    (r"httpx\.Client\(", "httpx.AsyncClient("),
    (r"def __enter__\(self\)", "async def __aenter__(self)"),
    (r"def __exit__\(", "async def __aexit__("),
    (r"self\.http\.close\(\)", "await self.http.aclose()"),
    (r"^(\s+)def (?!__init__|__aenter__|__aexit__)", r"\1async def "),
    (
        r"\bself\.(http\.request|request|_send|list_jobs|list_objectives|get_job|get_objective|command|close|wait|_read_through_outages|update_schedule)\(",
        r"await self.\1(",
    ),
    (r"^(\s+)for (\w+) in (self\.|parse_sse_async)", r"\1async for \2 in \3"),
    (r"^(\s+)with self\.http\.stream\(", r"\1async with self.http.stream("),
    (r"response\.read\(\)", "await response.aread()"),
    (r"time\.sleep\(", "await asyncio.sleep("),
    (r"Use it as a context manager", "Use it as an async context manager"),
)


def async_clients() -> dict[Path, str]:
    """The asyncio modules: each blocking one of ASYNC_OF with every blocking call made
    awaitable."""
    texts = {source: source.read_text(encoding="utf-8") for source in ASYNC_OF}
    for pattern, replacement in ASYNC_RULES:
        matched = 0
        for source, text in texts.items():
            wanted = ASYNC_OF[source][1] if replacement == "DOCSTRING" else replacement
            texts[source], count = re.subn(pattern, wanted, text, flags=re.MULTILINE | re.DOTALL)
            matched += count
        if not matched:
            raise SystemExit(f"tools/client_models.py: rule {pattern!r} matched nothing")
    return {
        ASYNC_OF[source][0]: formatted(text, ASYNC_OF[source][0]) for source, text in texts.items()
    }


def formatted(text: str, path: Path) -> str:
    """`text` as `ruff check --fix` and `ruff format` leave it at `path` (the repository's
    settings: imports sorted, needless `noqa`s dropped)."""
    ruff = str(Path(sysconfig.get_path("scripts")) / "ruff")
    for command in (["check", "--fix-only", "--exit-zero", "--quiet"], ["format"]):
        text = subprocess.run(
            [ruff, *command, "--stdin-filename", str(path), "-"],
            input=text,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
    return text


def model_parts(text: str) -> dict[Path, str]:
    """The generated models as a package of parts of about SPLIT_LINES lines each, cut between
    top-level classes in the generator's order (a model names only models defined before it,
    so each part imports the parts before it); `__init__.py` exports them all."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    first = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    header = "".join(lines[: first.lineno - 1]).rstrip() + "\n"
    parts: list[list[str]] = [[]]
    size = 0
    for node in tree.body[tree.body.index(first) :]:
        end = node.end_lineno or node.lineno
        chunk = "".join(lines[node.lineno - 1 : end]).rstrip() + "\n"
        if size + chunk.count("\n") > SPLIT_LINES and parts[-1]:
            parts.append([])
            size = 0
        parts[-1].append(chunk)
        size += chunk.count("\n") + 2
    names = [f"_part{n + 1}" for n in range(len(parts))]
    star = "from receipt_client.models.{} import *  # noqa: F403\n"
    files: dict[Path, str] = {}
    for n, chunks in enumerate(parts):
        earlier = "".join(star.format(name) for name in names[:n])
        path = MODELS / f"{names[n]}.py"
        files[path] = formatted(header + earlier + "\n\n" + "\n\n".join(chunks), path)
    exported = '"""The API\'s schemas as pydantic models: the parts of one generated module."""\n\n'
    init = MODELS / "__init__.py"
    files[init] = formatted(exported + "".join(star.format(name) for name in names), init)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Compare; write nothing.")
    args = parser.parse_args(argv)
    text = document_text()
    wanted = {
        DOCUMENT: text,
        **model_parts(formatted(models_of(text), MODELS / "generated.py")),
        **async_clients(),
    }
    extra = sorted(set(MODELS.glob("*.py")) - set(wanted))
    if args.check:
        stale = [
            str(path.relative_to(ROOT))
            for path, want in wanted.items()
            if not path.exists() or path.read_text(encoding="utf-8") != want
        ] + [f"{path.relative_to(ROOT)} (not generated)" for path in extra]
        if stale:
            print(f"stale: {', '.join(stale)} (run `make client`)", file=sys.stderr)
            return 1
        return 0
    MODELS.mkdir(exist_ok=True)
    for path in extra:
        path.unlink()
    for path, want in wanted.items():
        path.write_text(want, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
