"""Run by tests/compat/test_imports.py as a script: each program named on the command line runs
in a child forked from this interpreter before it imported Lightning or lightning_accudnn.

This interpreter first imports torch, torch._dynamo and torchvision, the bulk of what every
program imports anyway (Lightning's metrics import torchvision, lightning_accudnn imports
torch._dynamo) and none of what the programs check the order of; each child then starts from
that state as a fresh interpreter would, without paying for those imports again.

Usage: ``python tests/compat/fresh_imports.py PROGRAMS.json``, a JSON object of name -> code.
Prints one JSON object: name -> {"status": the child's exit status, "output": its stdout and
stderr}."""

import json
import os
import sys
import traceback
from pathlib import Path

# The checkout's own package first, as ``python -c`` run from the repository root would have it.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402, F401
import torch._dynamo  # noqa: E402, F401
import torchvision  # noqa: E402, F401

#: Top-level packages whose import order the programs check: none may be loaded before a fork.
CHECKED = ("lightning", "lightning_fabric", "pytorch_lightning", "lightning_accudnn", "torchmetrics")


def loaded_checked_packages() -> list[str]:
    return sorted(name for name in sys.modules if name.split(".")[0] in CHECKED)


def run_forked(code: str) -> dict:
    """Run ``code`` as ``__main__`` in a forked child; its exit status and what it printed."""
    assert not loaded_checked_packages(), loaded_checked_packages()
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: its output into the pipe, its exit status from the program
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        status = 0
        try:
            exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})
        except BaseException:  # noqa: BLE001 - reported through the output and the status
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    os.close(write)
    with os.fdopen(read, encoding="utf-8", errors="replace") as pipe:
        output = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    return {"status": os.waitstatus_to_exitcode(wait_status), "output": output}


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as file:
        programs = json.load(file)
    print(json.dumps({name: run_forked(code) for name, code in programs.items()}))
