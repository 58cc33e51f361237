"""One result record: what every benchmark's JSON says about how and where it was made.

The command line, the git commit, the versions of SGLang, torch and Triton, the GPU, and an
atomic JSON write (a run cut short leaves the previous complete file, never half of one).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

REPO = str(Path(__file__).resolve().parents[2])  # the checkout
VERSION_MODULES = ("sglang", "torch", "triton", "sglang_zipage")


def command_line(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> str:
    """``prog`` (default: this process's script, quoted) and ``argv`` (default: its arguments),
    each argument quoted for a shell."""
    argv = sys.argv[1:] if argv is None else argv
    prog = shlex.quote(sys.argv[0]) if prog is None else prog
    return " ".join([prog, *(shlex.quote(a) for a in argv)])


def git_commit(dirty: bool = False) -> Optional[str]:
    """$ZIPAGE_COMMIT when set (a copied checkout, e.g. on the GPU machine, may carry no .git
    or a stale one), else the checkout's HEAD (with ``+dirty`` if asked and the tree has
    changes), else None."""
    if os.environ.get("ZIPAGE_COMMIT"):
        return os.environ["ZIPAGE_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
    except Exception:
        return None
    if dirty:
        status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        sha += "+dirty" if status else ""
    return sha


def versions(modules: Iterable[str] = VERSION_MODULES) -> Dict[str, str]:
    """Python's version and each module's ``__version__`` (imports them)."""
    out = {"python": sys.version.split()[0]}
    for mod in modules:
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:
            out[mod] = f"unavailable: {e}"
    return out


def gpu_name(cpu: str = "cpu") -> str:
    """The first CUDA device's name, else ``cpu``. Creates a CUDA context: call it after the
    engines of the run have shut down (or in a process that starts none)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu


def write_json(doc, path: str, indent: int = 1) -> None:
    """Write ``doc`` to ``path`` through a temporary file and a rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=indent, default=str)
    os.replace(tmp, path)
