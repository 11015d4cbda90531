#!/usr/bin/env python3
"""The example planner `make up` starts with (RECEIPT_FACTORY_PLANNER_COMMAND): it reads
`{title, goal}` on stdin and prints a task graph, one task per sentence of the goal, each after
the one before, each a `prompt` for the coding agent (RECEIPT_CODEX_COMMAND). A real planner is
a model call that prints the same shape (README, "Plug in a real coding agent").
"""

import json
import re
import sys

request = json.loads(sys.stdin.read())
steps = [s.strip() for s in re.split(r"[.;\n]+", request["goal"]) if s.strip()][:8]
tasks = []
for number, step in enumerate(steps or [request["title"]], 1):
    task = {"taskId": f"step-{number}", "title": step, "input": {"prompt": step}}
    if number > 1:
        task["dependsOn"] = [f"step-{number - 1}"]
    tasks.append(task)
print(json.dumps({"tasks": tasks}))
