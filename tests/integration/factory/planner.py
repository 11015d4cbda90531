"""A test planner: reads {title, goal} on stdin, notes where it ran (its working directory, its
uid, whether it sees the given path), and prints a two-task graph that records the goal."""

import json
import os
import sys

request = json.load(sys.stdin)
goal = request["goal"]
probe = sys.argv[1] if len(sys.argv) > 1 else "/"
with open("planned-by.json", "w") as note:
    json.dump({"cwd": os.getcwd(), "uid": os.getuid(), "sees": os.path.exists(probe)}, note)
print("planning...", file=sys.stderr)
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
