"""A test planner: reads {title, goal} on stdin, prints a two-task graph that records the goal."""

import json
import sys

request = json.load(sys.stdin)
goal = request["goal"]
print(
    json.dumps(
        {
            "tasks": [
                {
                    "taskId": "write",
                    "input": {"command": ["sh", "-c", f"echo '{goal}' > goal.txt"]},
                },
                {
                    "taskId": "check",
                    "dependsOn": ["write"],
                    "input": {"command": ["grep", "-q", goal, "goal.txt"]},
                },
            ]
        }
    )
)
