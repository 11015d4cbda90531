"""What the worker writes into an agent job's workspace, which its commands own: never through
something they left there."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities.handlers.agent_turn import initialise_workspace, workspace_of
from activities.sandbox_policy import SandboxSettings
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.protocol import compose_agents_md
from receipts.agent_jobs.registry import AgentDefinition

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def agent_job(template: str) -> AgentJob:
    return AgentJob.model_validate(
        {
            "agentJobId": "aj-1",
            "agentId": "helper",
            "organizationId": "org-a",
            "ownerSessionId": "s-1",
            "sourceActorEventId": "e-1",
            "sourceToolCallId": "t-1",
            "replyRoute": {"binding": "slack", "channel": "C1"},
            "input": {"prompt": "go"},
            "workspaceTemplate": template,
            "workspaceOwnerJobId": "aj-1",
            "createdAt": NOW,
            "updatedAt": NOW,
        }
    )


def test_agents_md_is_never_written_through_a_link_a_command_left(tmp_path: Path) -> None:
    """A turn's command replaced AGENTS.md with a link to a host path (a `.pth` in the worker's
    virtualenv, say): the next turn's initialisation must not create the target with the
    tenant's template in it (that ran code as the worker)."""
    settings = SandboxSettings(mode="none", workspace_root=tmp_path / "ws")
    job = agent_job("import os; os.system('owned')")
    agent = AgentDefinition(id="helper", command=["true"])
    workspace = initialise_workspace(job, agent, settings)
    assert workspace == workspace_of(job, settings)
    assert (workspace / "AGENTS.md").read_text().startswith("import os")
    host = tmp_path / "host" / "site-packages"
    host.mkdir(parents=True)
    target = host / "zz-receipt.pth"
    (workspace / "AGENTS.md").unlink()
    (workspace / "AGENTS.md").symlink_to(target)  # dangling: the target does not exist yet
    initialise_workspace(job, agent, settings)
    assert not target.exists()
    assert (workspace / "AGENTS.md").is_symlink()  # left as the command left it
    # A link to an existing host file is not written through either.
    target.write_text("the host's own\n")
    initialise_workspace(job, agent, settings)
    assert target.read_text() == "the host's own\n"


class Died(BaseException):
    """The worker killed at this point (SIGKILL, an OOM kill): nothing after it runs."""


def test_agents_md_cut_off_while_written_is_written_whole_by_the_next_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AGENTS.md was created (O_EXCL) and then written: a worker that died in between, or a
    write that failed (the disk full), left it empty or cut, and every later turn found it there
    and kept it ("on first initialisation only") — the job ran for good without its guidance."""
    import activities.handlers.agent_turn as agent_turn

    settings = SandboxSettings(mode="none", workspace_root=tmp_path / "ws")
    job = agent_job("the template\n")
    agent = AgentDefinition(id="helper", command=["true"])
    real_fdopen = os.fdopen

    class CutOff:
        """A file whose write gets half its bytes onto the disk, then the worker dies."""

        def __init__(self, fd: int, *args: object, **kwargs: object) -> None:
            self.file = real_fdopen(fd, "wb")

        def __enter__(self) -> CutOff:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def fileno(self) -> int:
            return self.file.fileno()

        def write(self, content: bytes) -> int:
            self.file.write(content[: len(content) // 2])
            self.file.flush()
            raise Died

    monkeypatch.setattr(agent_turn.os, "fdopen", CutOff)
    with pytest.raises(Died):
        initialise_workspace(job, agent, settings)
    monkeypatch.setattr(agent_turn.os, "fdopen", real_fdopen)
    workspace = initialise_workspace(job, agent, settings)
    whole = compose_agents_md(job, agent, str(workspace))
    assert (workspace / "AGENTS.md").read_text() == whole
    # Nothing of the cut-off write is left beside it for the commands to find.
    assert sorted(p.name for p in workspace.iterdir() if "AGENTS" in p.name) == ["AGENTS.md"]
