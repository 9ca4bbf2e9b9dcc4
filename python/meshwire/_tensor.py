"""torch tensors where the binding takes memory: CPU tensors are used where
they lie (their data pointer: no copy, no buffer protocol needed), and
their dtype -- bf16 and f16 included -- names the collectives' type.
torch is never imported here: a tensor is known by its type's module."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ._lib import T, ffi


def is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _check(t: Any, what: str) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"{what}: a {t.device} tensor (meshwire moves host memory: "
                         f"use a CPU tensor, pinned if it feeds a GPU)")
    if not t.is_contiguous():
        raise ValueError(f"{what}: not contiguous (meshwire moves tensors where they lie)")


def span(t: Any, what: str = "tensor") -> Tuple[Any, int]:
    """(pointer, bytes) of CPU tensor @t, contiguous; the caller keeps @t
    referenced while the pointer is used."""
    _check(t, what)
    n = t.numel() * t.element_size()
    return ffi.cast(T.char_p, t.data_ptr()), n


class BF16(np.ndarray):
    """A uint16 view of a bf16 tensor: its collectives' type is bf16."""


def as_array(t: Any, what: str) -> np.ndarray:
    """A numpy view of CPU tensor @t (no copy), for the collectives."""
    _check(t, what)
    import torch                           # loaded already: @t is one of its tensors
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).view(BF16)
    return t.numpy()


def implied_dtype(arr: np.ndarray) -> Optional[str]:
    return "bf16" if isinstance(arr, BF16) else None


def alloc(ctx: Any, shape: Any, dtype: Any) -> Any:
    """Context.tensor: see there."""
    import torch
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise ValueError(f"tensor: shape {shape} must be non-negative ints")
        n *= d
    size = n * torch.empty((), dtype=dtype).element_size()
    buf = ctx.alloc(max(size, 1))
    return torch.frombuffer(buf, dtype=torch.uint8)[:size].view(dtype).view(shape)
