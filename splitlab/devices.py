"""Device presets: the numbers a split-K planner reasons with (SM or CU count) and the ceilings a
kernel is judged against (memory bandwidth, matrix rate, L2).

Datasheet figures are leads; where splitlab measured a ceiling on a real card it is kept beside the
datasheet value in its own field (``measured_*``), never in place of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitlab.errors import SplitlabError


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU: identity, the parallelism a planner sees, and its ceilings.

    ``sm_count`` is what ``multi_processor_count`` reports (SMs on NVIDIA, CUs on AMD): the number
    every planner in ``splitlab.planners`` is given as ``num_sms`` / ``sm_count``.
    """

    name: str
    vendor: str  # "nvidia" | "amd"
    arch: str  # "sm_90", "sm_100", "sm_120", "sm_121", "gfx942", "gfx950"
    sm_count: int
    hbm_gbps: float  # datasheet memory bandwidth, GB/s
    l2_mb: float  # last level on-chip cache a kernel's working set competes for (L2), MB
    bf16_tflops: float | None  # datasheet dense bf16 matrix rate, TFLOP/s
    source: str
    aliases: tuple[str, ...] = ()
    measured_read_gbps: float | None = None  # read ceiling measured by splitlab on this device
    measured_bf16_tflops: float | None = None  # bf16 matrix rate measured by splitlab
    warp_size: int = 32

    @property
    def roofline_gbps(self) -> float:
        """Bandwidth ceiling used for roofline fractions: measured when splitlab measured it."""
        return self.measured_read_gbps or self.hbm_gbps

    @property
    def roofline_tflops(self) -> float | None:
        """Matrix-rate ceiling used for roofline fractions: measured when splitlab measured it."""
        return self.measured_bf16_tflops or self.bf16_tflops


_NV_DS = "NVIDIA datasheet"
PRESETS: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        DeviceSpec("h100-sxm", "nvidia", "sm_90", 132, 3350, 50, 989,
                   f"{_NV_DS}: H100 SXM5 (132 SMs, 3.35 TB/s HBM3, 50 MB L2, 989 TFLOP/s dense bf16)",
                   aliases=("h100",)),
        DeviceSpec("h200-sxm", "nvidia", "sm_90", 132, 4800, 60, 989,
                   f"{_NV_DS}: H200 SXM (4.8 TB/s HBM3e, H100 compute); 132 SMs and 60 MB L2 as torch "
                   "reports on the lent H200; measured there: 4.5 TB/s read (a sum over 4 GiB read 4.23, "
                   "cuDNN's best decode 4.49) and 790 TFLOP/s bf16 (a matmul on random data)",
                   aliases=("h200",), measured_read_gbps=4500, measured_bf16_tflops=790),
        DeviceSpec("b200", "nvidia", "sm_100", 148, 8000, 126, 2250,
                   f"{_NV_DS}: HGX B200 (148 SMs, 8 TB/s HBM3e, 2.25 PFLOP/s dense bf16); L2 126 MB"),
        DeviceSpec("rtx5090", "nvidia", "sm_120", 170, 1792, 96, 209.5,
                   f"{_NV_DS}: GeForce RTX 5090 (170 SMs, 1.79 TB/s GDDR7, 96 MB L2); SM count as in "
                   "FlashInfer's cake planner docstring (seed 001)",
                   aliases=("rtx-5090", "5090")),
        DeviceSpec("rtx-pro-6000", "nvidia", "sm_120", 188, 1792, 128, None,
                   f"{_NV_DS}: RTX PRO 6000 Blackwell (188 SMs, 1.79 TB/s GDDR7, 128 MB L2); SM count as "
                   "in FlashInfer's cake planner docstring (seed 001)",
                   aliases=("rtx-pro-6000-blackwell", "rtxpro6000")),
        DeviceSpec("gb10", "nvidia", "sm_121", 48, 273, 24, None,
                   f"{_NV_DS}: GB10 Grace Blackwell superchip (48 SMs, 273 GB/s LPDDR5x); 48 SMs as in "
                   "FlashInfer's cake planner docstring (seed 001)"),
        DeviceSpec("mi300x", "amd", "gfx942", 304, 5300, 32, 1307,
                   "AMD Instinct MI300X datasheet (304 CUs, 5.3 TB/s HBM3, 8 x 4 MB L2 + 256 MB "
                   "Infinity Cache, 1307 TFLOP/s dense bf16)", warp_size=64),
        DeviceSpec("mi325x", "amd", "gfx942", 304, 6000, 32, 1307,
                   "AMD Instinct MI325X datasheet (304 CUs, 6 TB/s HBM3e, 8 x 4 MB L2 + 256 MB "
                   "Infinity Cache, 1307 TFLOP/s dense bf16)", warp_size=64),
        DeviceSpec("mi355x", "amd", "gfx950", 256, 8000, 32, 2500,
                   "AMD Instinct MI355X datasheet (256 CUs, 8 TB/s HBM3e, 8 x 4 MB L2 + 256 MB "
                   "Infinity Cache, 2.5 PFLOP/s dense bf16); 256 CUs as seed 000 and seed 003 state",
                   warp_size=64),
    ]
}

_ALIASES = {alias: d.name for d in PRESETS.values() for alias in (d.name, *d.aliases)}


def names() -> list[str]:
    """Preset names, in table order."""
    return list(PRESETS)


def get(name: str) -> DeviceSpec:
    """Look a preset up by name or alias, case-insensitively (``get("H200")``)."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    if key not in _ALIASES:
        raise SplitlabError(f"device={name!r} is not allowed; expected one of {', '.join(names())}")
    return PRESETS[_ALIASES[key]]


def detect(index: int | None = None) -> DeviceSpec:
    """Describe the GPU torch sees (``index`` or the current device).

    The SM count and L2 come from the card itself; bandwidth and matrix rate come from the matching
    preset (matched by SM count and architecture), since torch cannot measure them.
    """
    import torch  # local: planners and presets stay importable without torch

    if not torch.cuda.is_available():
        raise SplitlabError("detect() needs a GPU; torch sees none (use a preset: splitlab devices)")
    idx = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(idx)
    is_amd = getattr(torch.version, "hip", None) is not None
    arch = getattr(props, "gcnArchName", "").split(":")[0] if is_amd else f"sm_{props.major}{props.minor}"
    # By name first (an H100 and an H200 have the same SM count and architecture), then by SMs and arch.
    label = props.name.lower().replace(" ", "")
    match = next((d for d in PRESETS.values() if d.sm_count == props.multi_processor_count and d.arch == arch
                  and any(a.split("-")[0] in label for a in (d.name, *d.aliases))), None) \
        or next((d for d in PRESETS.values() if d.sm_count == props.multi_processor_count and d.arch == arch), None)
    l2_mb = getattr(props, "L2_cache_size", 0) / 2**20 or (match.l2_mb if match else 0.0)
    base = match or DeviceSpec(props.name, "amd" if is_amd else "nvidia", arch, props.multi_processor_count,
                               0.0, l2_mb, None, "detected; no preset matched")
    return DeviceSpec(
        name=base.name, vendor=base.vendor, arch=arch, sm_count=props.multi_processor_count,
        hbm_gbps=base.hbm_gbps, l2_mb=l2_mb, bf16_tflops=base.bf16_tflops,
        source=f"detected: {props.name} (index {idx}); ceilings from preset {base.name}",
        measured_read_gbps=base.measured_read_gbps, measured_bf16_tflops=base.measured_bf16_tflops,
        warp_size=64 if is_amd else 32,
    )
