"""Accept CuPy arrays and torch CUDA tensors alike (zero copy via DLPack) and hand results
back as the caller's kind.

bf16: CuPy has no native bfloat16 dtype. Torch ``bfloat16`` tensors are viewed as int16 and
passed zero-copy; CuPy callers pass the raw bits as a ``uint16``/``int16`` array together with
``dtype="bfloat16"``. Outputs keep the storage dtype of the input (torch bf16 in, torch bf16 out;
CuPy uint16 in, CuPy uint16 out).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Wrapped:
    arr: object  # cupy.ndarray
    kind: str  # 'cupy' | 'torch'
    dtype: str  # 'float16' | 'bfloat16' | numpy dtype name (int32 ...)
    torch_device: object = None


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def wrap(x, name: str, dtype: str | None = None, allow_host: bool = False) -> Wrapped:
    """``allow_host``: also take a numpy array (copied to the device; for small index arrays)."""
    import cupy as cp
    import numpy as np
    if allow_host and isinstance(x, (np.ndarray, list, tuple)):
        arr = cp.asarray(np.asarray(x))
        return Wrapped(arr, "cupy", str(arr.dtype))
    if _is_torch(x):
        import torch
        if not x.is_cuda:
            raise TypeError(f"{name}: expected a CUDA tensor, got one on {x.device}")
        # inside a CUDA graph capture DLPack's stream handshake (an event on torch's stream that
        # CuPy's stream waits on) would pull another stream into the capture: a plain view instead
        view = _cupy_view if torch.cuda.is_current_stream_capturing() else cp.from_dlpack
        if x.dtype == torch.bfloat16:
            return Wrapped(view(x.view(torch.int16)), "torch", "bfloat16", x.device)
        arr = view(x)
        return Wrapped(arr, "torch", str(arr.dtype), x.device)
    if isinstance(x, cp.ndarray):
        dt = str(x.dtype)
        if dt in ("uint16", "int16"):
            if dtype != "bfloat16":
                raise TypeError(f"{name}: a {dt} CuPy array is taken as raw bfloat16 bits only with "
                                "dtype='bfloat16'")
            dt = "bfloat16"
        return Wrapped(x, "cupy", dt)
    raise TypeError(f"{name}: expected a CuPy array or a torch CUDA tensor, got {type(x).__name__}")


def _cupy_view(t):
    """A CuPy array over a torch CUDA tensor's memory, without DLPack (no stream work)."""
    import cupy as cp
    item = t.element_size()
    span = (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * item if t.numel() else 0
    mem = cp.cuda.UnownedMemory(t.data_ptr(), span, t, t.device.index)
    return cp.ndarray(tuple(t.shape), str(t.dtype).split(".")[-1], cp.cuda.MemoryPointer(mem, 0),
                      strides=tuple(st * item for st in t.stride()))


def unwrap(arr, like: Wrapped):
    """``arr`` (CuPy) as the kind of ``like``."""
    if like.kind == "torch":
        import torch
        t = torch.from_dlpack(arr)
        return t.view(torch.bfloat16) if like.dtype == "bfloat16" else t
    return arr


def torch_stream(w: Wrapped):
    """A CuPy stream wrapping torch's current stream for ``w``'s device (None for CuPy input)."""
    if w.kind != "torch":
        return None
    import cupy as cp
    import torch
    return cp.cuda.ExternalStream(torch.cuda.current_stream(w.torch_device).cuda_stream)


def stream_ctx(w: Wrapped):
    """A context that launches on torch's current stream for torch input (a no-op for CuPy's)."""
    import contextlib
    s = torch_stream(w)
    return s if s is not None else contextlib.nullcontext()
