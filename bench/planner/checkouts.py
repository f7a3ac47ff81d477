"""Run a bench script against another checkout's ``lightning_accudnn``, in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["run_script"]


def run_script(checkout: Path, script: Path, *arguments: str) -> Any:
    """The JSON value ``script`` prints on its last line, run as ``python script arguments`` in
    ``checkout`` with ``PYTHONPATH`` set to it, so that it imports that checkout's
    ``lightning_accudnn`` (a ``RuntimeError`` with its error output if it fails).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     script = Path(folder) / "echo.py"
        ...     _ = script.write_text("import json, sys; print(json.dumps(sys.argv[1:]))")
        ...     run_script(Path(folder), script, "a", "b")
        ['a', 'b']
    """
    command = [sys.executable, str(script), *arguments]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} in {checkout} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
