"""Describe the machine and software a profile was measured on (for the sidecar metadata)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

import numpy as np
import pandas as pd
import torch

from calibrate.memory import total_memory_bytes


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_info(device: str) -> dict[str, Any]:
    """type, name, memory_bytes, threads, plus CUDA capability/driver where available."""
    info: dict[str, Any] = {"type": device, "memory_bytes": total_memory_bytes(device),
                            "threads": torch.get_num_threads()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count)
        driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        if driver is not None:
            try:
                version = int(driver())
                info["driver_cuda_version"] = f"{version // 1000}.{version % 1000 // 10}"
            except Exception:  # noqa: BLE001 - a nice-to-have field
                pass
    else:
        info.update(name=cpu_name(), machine=platform.machine())
    return info


def versions() -> dict[str, str | None]:
    try:
        specbatch = metadata.version("specbatch")
    except metadata.PackageNotFoundError:
        specbatch = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": str(cudnn) if cudnn else None, "numpy": np.__version__, "pandas": pd.__version__,
            "specbatch": specbatch, "platform": sys.platform}
