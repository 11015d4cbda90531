"""Write a function and have Receipt run it durably.

    from receipt_worker import handler, JobContext, Retry

    @handler("release-bot", kinds=["factory.task.run"])
    async def run(job: JobContext) -> dict[str, str]:
        await job.progress("tagging")
        return {"released": job.payload["version"]}

Receipt runs the function under the same lease, heartbeats, execution timeout, attempt fence,
re-read and settle as its built-in handlers. Install it with an entry point in the package's
`pyproject.toml` (the name is the agent id):

    [project.entry-points."receipt.handlers"]
    release-bot = "release_bot:run"

Every worker role loads the installed handlers at start, lists them in its log and is not ready
while one fails to load (README, "Write your own agent").
"""

from receipt_worker.sdk import (
    AgentHandler,
    Command,
    Fail,
    JobContext,
    Retry,
    SandboxRun,
    handler,
)

__all__ = ["AgentHandler", "Command", "Fail", "JobContext", "Retry", "SandboxRun", "handler"]
