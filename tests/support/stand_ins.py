"""Run a probe in a fresh interpreter where ``torch`` and ``numpy`` are empty stand-in packages.

Any import of them then lands in ``sys.modules`` even on a machine without them, so a probe can report
whether the config layer imported them. The probe prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hyper_parallel.config.targets import ALLOWED_TARGETS_ENV

__all__ = ["DRY_RUN_PROBE", "run_without_torch"]

ROOT = Path(__file__).resolve().parents[2]

#: ``--dry-run`` of the file in ``argv[1]`` (more flags after it): its exit status, output, and which heavy
#: modules it imported.
DRY_RUN_PROBE = """
import io, json, sys
from hyper_parallel.launch import main
out, err = io.StringIO(), io.StringIO()
status = main(["--config-file", sys.argv[1], "--dry-run", *sys.argv[2:]], out=out, err=err)
heavy = sorted(name for name in ("torch", "numpy") if name in sys.modules)
print(json.dumps({"status": status, "heavy": heavy, "out": out.getvalue(), "err": err.getvalue()}))
"""


def run_without_torch(tmp: Path, probe: str, *args: str) -> Any:
    """The JSON report ``probe`` prints, run from the repository root with the stand-ins first on the path
    and no launcher or allowlist variables from this environment."""
    shadow = tmp / "stand-ins"
    for name in ("torch", "numpy"):
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", ALLOWED_TARGETS_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-c", probe, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
