"""Is there a CUDA GPU we can use? Lazy CuPy/torch imports that never raise.

``cuda_available()`` is what tests and the CLI ask; ``require_cupy(what)`` returns the
``cupy`` module or raises :class:`sim.errors.NeedsGPUError` with one clear line.
"""

from __future__ import annotations

import functools

from pagesim.sim.errors import NeedsGPUError


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[bool, str]:
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return False, f"CuPy is not importable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); " \
                      "install the CuPy of your CUDA: pip install cupy-cuda12x (CUDA 12) or cupy-cuda13x (CUDA 13)"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return False, "no CUDA device visible"
    return True, ""


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device. Never raises."""
    try:
        return _probe()[0]
    except Exception:
        return False


def why_not() -> str:
    """Why :func:`cuda_available` is False ('' when it is True)."""
    try:
        return _probe()[1]
    except Exception as e:  # pragma: no cover
        return str(e)


def require_cupy(what: str = "this command"):
    """Return the ``cupy`` module, or raise NeedsGPUError naming ``what``."""
    if not cuda_available():
        raise NeedsGPUError(f"{what} needs a CUDA GPU with CuPy: {why_not()}")
    import cupy
    return cupy


def torch_module():
    """``torch`` if importable, else None. Never raises."""
    try:
        import torch
        return torch
    except Exception:
        return None


def torch_cuda_available() -> bool:
    t = torch_module()
    try:
        return bool(t is not None and t.cuda.is_available())
    except Exception:
        return False


def device_info(what: str = "device_info") -> dict:
    """Name, compute capability, SMs, memory, L2 of the current device (needs CuPy)."""
    cp = require_cupy(what)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    free, total = cp.cuda.runtime.memGetInfo()
    return {
        "name": name,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "sm_count": int(props["multiProcessorCount"]),
        "total_mem_bytes": int(total),
        "free_mem_bytes": int(free),
        "l2_bytes": int(props.get("l2CacheSize", 50 << 20)),
        "max_smem_optin_bytes": int(props.get("sharedMemPerBlockOptin", 48 << 10)),
        "cuda_runtime": int(cp.cuda.runtime.runtimeGetVersion()),
        "cupy": cp.__version__,
    }


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (for file names)."""
    s = name.lower().replace("nvidia", "").strip()
    out = "".join(c if c.isalnum() else "-" for c in s).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    return out or "gpu"
