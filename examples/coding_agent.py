#!/usr/bin/env python3
"""The example coding agent `make up` starts with (RECEIPT_CODEX_COMMAND): a `prompt` task runs
it in the objective's workspace with the prompt on stdin. It records the prompt in WORK.md and
says so; a real coding-agent CLI reads the same prompt and edits the workspace (README, "Plug in
a real coding agent").
"""

import sys
from pathlib import Path

prompt = sys.stdin.read().strip()
work = Path("WORK.md")
done = work.read_text(encoding="utf-8") if work.exists() else "# Work\n"
work.write_text(f"{done}\n- {prompt}\n", encoding="utf-8")
print(f"recorded in WORK.md: {prompt}")
