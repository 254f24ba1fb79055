"""What a host's devices are and how they are wired, read without torch (`nvidia-smi`).

Used by the worker when it registers (the Celery process never imports torch) and by rank 0
when it writes the result's `hardware` block. Without `nvidia-smi` the host is a CPU host.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_NVLINK = re.compile(r"\bNV\d+\b")


@dataclass(frozen=True)
class Gpus:
    names: list[str]
    memory_bytes: list[int]


def _smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpus() -> Gpus | None:
    """This host's GPUs (name and memory of each), or None when it has none that nvidia-smi sees."""
    out = _smi("--query-gpu=name,memory.total", "--format=csv,noheader,nounits")
    if not out or not out.strip():
        return None
    names, memory = [], []
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        names.append(name.strip())
        memory.append(int(float(mib.strip())) * 1024 * 1024 if mib.strip().replace(".", "").isdigit() else 0)
    return Gpus(names, memory)


def interconnect_from_topo(matrix: str) -> str:
    """'nvlink' if any two GPUs of `nvidia-smi topo -m` are joined by NVLink (NV#), else 'pcie'."""
    return "nvlink" if _NVLINK.search(matrix) else "pcie"


def interconnect() -> str:
    """How this host's devices talk: 'nvlink', 'pcie', or 'cpu' on a host without GPUs."""
    if gpus() is None:
        return "cpu"
    matrix = _smi("topo", "-m")
    return interconnect_from_topo(matrix) if matrix else "unknown"


def short_gpu_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' → 'h100'; 'NVIDIA A100-SXM4-80GB' → 'a100'; 'NVIDIA GeForce RTX 4090' → 'rtx4090'."""
    words = re.sub(r"\b(NVIDIA|Tesla|GeForce|Quadro)\b", " ", name, flags=re.IGNORECASE).replace("-", " ").split()
    for i, word in enumerate(words):
        if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", word) and not re.fullmatch(r"\d+GB", word, flags=re.IGNORECASE):
            return word.lower()
        if word.upper() == "RTX" and i + 1 < len(words):
            return ("rtx" + words[i + 1]).lower()
    return re.sub(r"[^a-z0-9]+", "", name.lower())[:32] or "gpu"


def pool_name(gpu_names: list[str] | None) -> str:
    """The pool a host belongs to by default: 'cpu', or '<gpu>x<count>' such as 'h100x8'."""
    if not gpu_names:
        return "cpu"
    return f"{short_gpu_name(gpu_names[0])}x{len(gpu_names)}"


def cpu_name() -> str:
    """The CPU's model name (the device name of a CPU host)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
