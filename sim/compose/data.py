"""Where the kernel microbenchmarks live, and reading them.

The data is NVIDIA's AIConfigurator collection (the ``aiconfigurator-core`` package,
Apache-2.0): per GPU a spec sheet ``systems/<gpu>.yaml`` and, per op, framework and
framework version, Parquet tables under ``systems/data/<gpu>/<op>/<framework>/<version>/``.
Only the Parquet schema and the YAML are read here; the package's Python API is not
used (it is in flux, the files are simple and stable). ``--kernel-data DIR`` points at
any folder laid out like ``systems/``.

Units in the tables: latency in milliseconds, sizes in elements/tokens; converted to
seconds on reading.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.errors import InputError

PACKAGE = "aiconfigurator-core"
MODULE = "aiconfigurator_core"
INSTALL = 'pip install -e ".[gpu-data]"'
GEMM_TABLE = ("gemm", "gemm_perf.parquet")
CONTEXT_TABLE = ("attention", "context_attention_perf.parquet")
GENERATION_TABLE = ("attention", "generation_attention_perf.parquet")
ALL_REDUCE_TABLE = ("comm", "custom_allreduce_perf.parquet")  # comm/<framework>/<version>/: the framework's all-reduce
NCCL_TABLE = ("comm", "nccl_perf.parquet")  # comm/nccl/<NCCL version>/: nccl-tests' collectives
MOE_TABLE = ("moe", "moe_perf.parquet")
NCCL = "nccl"
# The attention kernel each framework runs by default, best first: FA3 on Hopper,
# FA2 on Ada (L40S), the one FlashAttention build recorded for older collections (A100).
ATTENTION_KERNELS = ("vllm_flash_attn_fa3", "vllm_flash_attn_fa2", "vllm_flash_attn", "flash_attn")
GEMM_DTYPES = {"bf16": "bfloat16", "fp8": "fp8", "fp8-block": "fp8_block"}  # --dtype -> the tables' gemm_dtype
WEIGHT_BYTES = {"bf16": 2, "fp8": 1, "fp8-block": 1}  # a linear layer's weight, per parameter


@dataclass(frozen=True)
class GpuSpec:
    """The spec-sheet numbers composition uses (from ``systems/<gpu>.yaml``)."""

    name: str
    mem_bw: float  # bytes/s, datasheet
    mem_bw_scaling: float  # achievable fraction of mem_bw (the sheet's empirical factor)
    mem_latency_s: float  # fixed cost of one memory-bound kernel (the sheet's empirical constant)
    mem_capacity: int  # bytes
    reserved_bytes: int  # the sheet's "other_mem": activations, CUDA graphs, allocator slack
    bf16_flops: float
    fp8_flops: float | None
    nccl_bytes: tuple[tuple[int, int], ...] = ()  # (GPUs, bytes): NCCL's buffers per GPU in a group of that size
    nccl_version: str | None = None  # the NCCL the system's collectives were measured with

    def nccl_reserve(self, gpus: int) -> int:
        """Bytes per GPU NCCL's buffers take in a tensor-parallel group of ``gpus`` (0 on one GPU)."""
        return dict(self.nccl_bytes).get(gpus, 0) if gpus > 1 else 0

    @property
    def effective_bw(self) -> float:
        return self.mem_bw * self.mem_bw_scaling

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["nccl_bytes"] = {str(g): b for g, b in self.nccl_bytes}
        return out


def package_version() -> str | None:
    """The installed aiconfigurator-core's version, or None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return None


def systems_dir(kernel_data: str | Path | None) -> Path:
    """``--kernel-data`` if given, else the installed package's ``systems/`` (found without importing it)."""
    if kernel_data is not None:
        root = Path(kernel_data)
        if not (root / "data").is_dir():
            raise InputError(f"'{root}' has no data/ folder (expected the layout of aiconfigurator-core's "
                             f"systems/: <gpu>.yaml and data/<gpu>/<op>/<framework>/<version>/*.parquet)",
                             field="kernel-data")
        return root
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"composing needs NVIDIA's kernel data ({PACKAGE}); install it with {INSTALL}, "
                         f"or point --kernel-data at a folder of it", field="kernel-data")
    return Path(list(spec.submodule_search_locations)[0]) / "systems"


def _require_readers() -> None:
    for module, what in (("pyarrow", "Parquet tables"), ("yaml", "GPU spec sheets")):
        if importlib.util.find_spec(module) is None:
            raise InputError(f"reading the {what} needs {module}; install it with {INSTALL}", field="kernel-data")


def _choices(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


def table_dir(root: Path, gpu: str, op: str, framework: str, version: str) -> Path:
    """The folder of one op's tables; an unknown GPU, framework or version lists what the data has."""
    gpus = [g for g in _choices(root / "data")  # the package ships empty folders for some GPUs: not data
            if (root / f"{g}.yaml").is_file() and _choices(root / "data" / g / op)]
    if gpu not in gpus:
        raise InputError(f"no kernel data for GPU '{gpu}' (the data has: {', '.join(gpus)})", field="gpu")
    frameworks = _choices(root / "data" / gpu / op)
    if framework not in frameworks:
        raise InputError(f"no {op} data for framework '{framework}' on {gpu} (it has: "
                         f"{', '.join(frameworks) or 'none'})", field="framework")
    versions = _choices(root / "data" / gpu / op / framework)
    if version not in versions:
        raise InputError(f"no {op} data for {framework} {version} on {gpu} (it has: {', '.join(versions)})",
                         field="framework-version")
    return root / "data" / gpu / op / framework / version


def newest_version(root: Path, gpu: str, framework: str) -> str:
    """The newest version of ``framework`` whose GEMM tables the data has for ``gpu`` (the default
    of ``--framework-version``: NVIDIA's data covers GPUs at different versions, A100 an older one);
    an unknown GPU or framework is the one-line error :func:`table_dir` gives."""
    gemm = root / "data" / gpu / "gemm" / framework
    versions = _choices(gemm)
    if not versions:
        table_dir(root, gpu, "gemm", framework, "")  # names what the data has instead

    def key(version: str) -> tuple:
        return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))
    return max(versions, key=key)


def read_table(root: Path, gpu: str, framework: str, version: str, which: tuple[str, str]) -> pd.DataFrame:
    """One Parquet table with latency converted to seconds (``latency_s``)."""
    _require_readers()
    op, file = which
    path = table_dir(root, gpu, op, framework, version) / file
    if not path.is_file():
        raise InputError(f"no {file} for {framework} {version} on {gpu}", source=path.parent, field="framework-version")
    frame = pd.read_parquet(path)
    frame["latency_s"] = frame["latency"].astype(float) * 1e-3  # the tables are in milliseconds
    return frame


def nccl_versions(root: Path, gpu: str) -> list[str]:
    """The NCCL versions whose collectives the data measured on this GPU (empty where none)."""
    folder = root / "data" / gpu / NCCL_TABLE[0] / NCCL
    return [v for v in _choices(folder) if (folder / v / NCCL_TABLE[1]).is_file()]


def read_gpu_spec(root: Path, gpu: str) -> GpuSpec:
    _require_readers()
    import yaml

    path = root / f"{gpu}.yaml"
    if not path.is_file():
        gpus = sorted(p.stem for p in root.glob("*.yaml") if (root / "data" / p.stem).is_dir())
        raise InputError(f"no spec sheet for GPU '{gpu}' (the data has: {', '.join(gpus)})", field="gpu")
    raw = yaml.safe_load(path.read_text())
    sheet, misc = raw.get("gpu", {}), raw.get("misc", {})
    try:
        return GpuSpec(name=gpu, mem_bw=float(sheet["mem_bw"]),
                       mem_bw_scaling=float(sheet.get("mem_bw_empirical_scaling_factor", 1.0)),
                       mem_latency_s=float(sheet.get("mem_empirical_constant_latency", 0.0)),
                       mem_capacity=int(sheet["mem_capacity"]), reserved_bytes=int(misc.get("other_mem", 0)),
                       bf16_flops=float(sheet["bfloat16_tc_flops"]),
                       fp8_flops=float(sheet["fp8_tc_flops"]) if "fp8_tc_flops" in sheet else None,
                       nccl_bytes=tuple(sorted((int(g), int(b)) for g, b in (misc.get("nccl_mem") or {}).items())),
                       nccl_version=str(misc["nccl_version"]) if misc.get("nccl_version") else None)
    except KeyError as exc:
        raise InputError("missing key in the GPU spec sheet", source=path, field=str(exc.args[0])) from None


def attention_kernel(frame: pd.DataFrame, head_dim: int, source: Path | str) -> str:
    """The framework's default attention kernel among those the table measured for this head size."""
    present = set(frame.loc[frame.head_dim == head_dim, "kernel_source"])
    for kernel in ATTENTION_KERNELS:
        if kernel in present:
            return kernel
    raise InputError(f"no attention kernel measured for head_dim {head_dim} (the table has "
                     f"{sorted(set(frame.head_dim))})", source=source, field="head_dim")
