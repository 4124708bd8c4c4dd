"""Where and in what precision a model runs: the `--device` and `--dtype` of every command.

`resolve_device("auto")` picks CUDA, then Apple's MPS, then the CPU; `resolve_dtype("auto", ...)` keeps a
model's own dtype on an accelerator and uses float32 on the CPU (half precision matrix products are slow
on most CPUs, and the lossless checks compare against float32 references there). Both refuse what this
machine cannot do with a message that says what it has instead.

`forward_min_rows` gives the rows a state backend pads every forward to on a device (its `min_rows`):
on a CPU, what the backend's calibration measured to be no slower for this model (`padded_rows`), handed
to the backend when it is built (`specframe.contract.calibration.Calibration.min_rows`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from specframe.terms.errors import ConfigurationError

if TYPE_CHECKING:  # torch is imported where it is used: the CLI's help text needs none of it
    import torch

DEVICE_HELP = "auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:INDEX or mps."
DTYPE_HELP = "auto (the model's own dtype on an accelerator, float32 on CPU), float32, bfloat16 or float16."
CPU_MIN_ROWS = 4  # see `forward_min_rows`
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",  # names of torch dtypes
          "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch device for `spec`, checked to exist on this machine."""
    import torch

    if isinstance(spec, torch.device):
        spec = str(spec)
    text = (spec or "auto").strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps" if _mps_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ConfigurationError(f"unknown device {spec!r}: use {DEVICE_HELP}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigurationError(f"device {spec!r}: this machine has no CUDA GPU that torch can use "
                                     f"(torch {torch.__version__}); use --device cpu")
        index = 0 if device.index is None else device.index
        if index >= count:
            raise ConfigurationError(f"device {spec!r}: this machine has {count} CUDA GPU(s), "
                                     f"cuda:0 to cuda:{count - 1}")
        return torch.device("cuda", index)
    if device.type == "mps" and not _mps_available():
        raise ConfigurationError(f"device {spec!r}: MPS is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigurationError(f"device {spec!r} is not supported: use {DEVICE_HELP}")
    return device


def resolve_dtype(spec: str | torch.dtype | None, device: torch.device,
                  native: torch.dtype | None = None) -> torch.dtype:
    """The dtype to load weights in: `spec`, or for auto `native` (the checkpoint's) on an accelerator
    and float32 on the CPU."""
    import torch

    if isinstance(spec, torch.dtype):
        return spec
    text = (spec or "auto").strip().lower().removeprefix("torch.")
    if text == "auto":
        if device.type == "cpu" or native is None or not native.is_floating_point:
            return torch.float32
        return native
    if text not in DTYPES:
        raise ConfigurationError(f"unknown dtype {spec!r}: use {DTYPE_HELP}")
    return getattr(torch, DTYPES[text])


def native_dtype(config) -> torch.dtype | None:
    """The dtype a checkpoint's config declares (`dtype`, formerly `torch_dtype`), if any."""
    import torch

    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        name = DTYPES.get(value.removeprefix("torch."))
        value = getattr(torch, name) if name else None
    return value if isinstance(value, torch.dtype) else None


def forward_min_rows(value: int | None, device: torch.device, backend: str, linear: str = "onednn", *,
                     calibrated: int | None = None, pads_uncalibrated: bool = False) -> int:
    """Rows a state backend pads every forward to (its `min_rows` option): `value`, checked; or by default
    1 (no padding) off the CPU and where the model's linears are `linear="stream"`
    (`specframe.runtime.packed_linear.linear_kernel`); on a CPU, `calibrated`, the rows that the backend's
    calibration chose for this model (`padded_rows`; what the backend was handed, `Calibration.min_rows`),
    and without one `CPU_MIN_ROWS` where the backend `pads_uncalibrated` (it is known to gain), else 1.

    On some CPUs oneDNN's and the BLAS's 1- and 2-row matrix products stream the weights more slowly than
    their 4-row ones, so a padded plain step of an attention model (SmolLM2) is faster than an unpadded
    one (docs/explanation/metrics-and-costs.md); on others (an Intel Xeon with AMX) the padded step is
    slower. Where other work grows with the rows (a Bamba-style model's tree scan on `ssm-tree` doubled
    a plain step's time at hidden size 1024), padding
    is a loss, so it is measured per model and machine, not assumed.
    `stream_linear` reads the weights at one speed for 1 to 4 rows, so padding would only add work.
    """
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(
                f"backend {backend!r}: min_rows must be an integer >= 1 (1: no padding), got {value!r}")
        return value
    if not pads_by_measurement(value, device, linear):
        return 1
    if calibrated is not None:
        return calibrated
    return CPU_MIN_ROWS if pads_uncalibrated else 1


def pads_by_measurement(value: int | None, device: torch.device, linear: str = "onednn") -> bool:
    """Whether a backend given `min_rows=value` leaves padding to what calibration measures: no value
    given, on a CPU, with linears that are not `stream` (see `forward_min_rows`). What a backend's
    `StateBackend.pads_by_measurement` returns, for the `min_rows` it was built with."""
    return value is None and device.type == "cpu" and linear != "stream"


def padded_rows(one_row_s: float, padded_s: float, rows: int = CPU_MIN_ROWS) -> int:
    """The rows to pad every forward to, given a plain step's measured seconds alone (`one_row_s`) and
    padded to `rows` rows (`padded_s`): `rows` where padding was no slower, else 1 (no padding)."""
    return rows if padded_s <= one_row_s else 1


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock reading includes it (no-op on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def synchronizer(device: torch.device):
    """`synchronize` bound to `device`, or None where there is nothing to wait for (the CPU)."""
    return None if device.type == "cpu" else (lambda: synchronize(device))


def inference_mode(function: Callable) -> Callable:
    """`@torch.inference_mode()` for a method of a component: torch is imported when it runs, not when its
    module is, so registering the component (`specframe plugins`, `specframe --help`) loads no torch."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        import torch

        with torch.inference_mode():
            return function(*args, **kwargs)

    return run


def _mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())
