"""The environment a sweep ran in, for its JSON sidecar: device (name, UUID, SMs, L2, memory), driver, CUDA,
torch, triton, splitlab version and git commit (or, where there is no git checkout, a hash of splitlab's
sources), host, the command line. Works without a GPU (the device fields then say ``cpu``)."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import splitlab

_REPO = Path(splitlab.__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def git_commit() -> dict:
    """``commit`` (``SPLITLAB_GIT_COMMIT`` if set, else ``git rev-parse HEAD`` of the checkout), ``dirty``
    (uncommitted changes to tracked files), and ``source_sha1``: a hash of every ``splitlab/**/*.py``, which
    identifies the code even in a copy without ``.git``."""
    commit = os.environ.get("SPLITLAB_GIT_COMMIT") or _run(["git", "rev-parse", "HEAD"], cwd=_REPO)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO) if commit else None
    h = hashlib.sha1()
    for p in sorted((_REPO / "splitlab").rglob("*.py")):
        h.update(p.relative_to(_REPO).as_posix().encode())
        h.update(p.read_bytes())
    return dict(commit=commit, dirty=bool(status) if commit and not os.environ.get("SPLITLAB_GIT_COMMIT") else None,
                source_sha1=h.hexdigest())


def device_info(index: int | None = None) -> dict:
    """The GPU torch sees (or ``{"name": "cpu", ...}``): name, UUID, SMs, L2 bytes, memory, capability."""
    import torch

    if not torch.cuda.is_available():
        return dict(name="cpu", uuid=None, sm_count=None, l2_bytes=None, total_memory=None, capability=None,
                    index=None)
    idx = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(idx)
    uuid = getattr(props, "uuid", None)
    return dict(name=props.name, uuid=None if uuid is None else str(uuid), sm_count=props.multi_processor_count,
                l2_bytes=getattr(props, "L2_cache_size", None), total_memory=props.total_memory,
                capability=f"{props.major}.{props.minor}", index=idx)


def driver_version() -> str | None:
    """The NVIDIA driver version (``nvidia-smi``), else None."""
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def capture(argv: list[str] | None = None) -> dict:
    """Everything the sidecar records about where and how a sweep ran."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # triton is a dependency, but a sidecar must never fail for want of it
        triton_version = None
    return dict(
        device=device_info(),
        driver=driver_version(),
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        torch=torch.__version__,
        triton=triton_version,
        splitlab=splitlab.__version__,
        git=git_commit(),
        python=sys.version.split()[0],
        platform=platform.platform(),
        host=socket.gethostname(),
        pid=os.getpid(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
        argv=list(sys.argv if argv is None else argv),
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
