"""What every osftrt.torch module shares: the context a tensor's device maps
to, the tensor forms the library takes, autocast, and handle state that is
dropped when a module is copied or pickled."""
from __future__ import annotations

import torch

from .. import _threads, default_context


def context_for(tensor, context):
    """The caller's context, else this thread's default for the tensor's
    device (on CUDA following torch's current stream). The library's CPU
    thread count follows torch.get_num_threads() (osftrt/_threads.py)."""
    _threads.follow_host()
    if context is not None:
        return context
    ctx = default_context(tensor.device)
    if ctx.is_cuda:
        ctx.sync_torch_stream()
    return ctx


def follow_torch_stream(tensor, context):
    """Before each library call on CUDA: a default context runs on torch's
    current stream, which may differ from the one it had when the handle was
    made (``with torch.cuda.stream(s):``). A caller's own context keeps the
    stream it was given. On every device: the library's CPU thread count
    follows torch.get_num_threads() (a changed count is passed on)."""
    _threads.follow_host()
    if context is None and tensor.is_cuda:
        context_for(tensor, None)


def detached(t):
    """A tensor the library may take: detached (same storage), or None."""
    return None if t is None else t.detach()


def _rows_ok(t):
    """Row-major with unit column stride (compact or padded rows)."""
    return t.dim() == 0 or t.stride(-1) == 1 and all(
        t.stride(i) == t.stride(i + 1) * t.shape[i + 1] for i in range(t.dim() - 2)
    )


def as_rows(t):
    """t itself when the library can read it in place, else a compact copy."""
    return t if _rows_ok(t) else t.contiguous()


def storage_key(tensors):
    """What a library handle over these tensors depends on: a handle built
    for one key is rebuilt when the storage moves (optimizer re-creation,
    .to(), load_state_dict(assign=True), FSDP's re-allocation)."""
    return tuple(None if t is None else (t.data_ptr(), t.dtype, t.device, t.stride()) for t in tensors)


# --- autocast -----------------------------------------------------------------
def _autocast_enabled(device_type):
    try:
        return torch.is_autocast_enabled(device_type)  # torch >= 2.4
    except TypeError:
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return device_type == "cuda" and torch.is_autocast_enabled()


def _autocast_dtype(device_type):
    try:
        return torch.get_autocast_dtype(device_type)  # torch >= 2.4
    except AttributeError:
        return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def autocast_dtype(x):
    """The dtype an nn.Linear would compute x in under the active autocast,
    or None (no autocast for x's device, or x is not floating)."""
    if not x.is_floating_point() or not _autocast_enabled(x.device.type):
        return None
    return _autocast_dtype(x.device.type)


def library_dtype(dtype):
    """The library computes in fp32 or bf16: fp16 (CUDA autocast's default)
    is computed in fp32 and the result cast back, as a caller expects."""
    return dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32


def no_autocast(device_type):
    """A context in which the library's autograd functions run (they handle
    dtypes themselves; autocast must not re-cast their outputs)."""
    try:
        return torch.autocast(device_type, enabled=False)
    except RuntimeError:  # a device type without autocast
        return torch.autocast("cpu", enabled=False)


# --- copying and pickling -----------------------------------------------------
class TransientHandles:
    """Mixin for modules that cache library handles: ``copy.deepcopy``,
    ``pickle`` and ``torch.save`` of the module leave the handles (and a
    context given at construction, which a pickle cannot carry) behind; the
    copy creates its own on first use."""

    _transient = ()

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in self._transient:
            if name in state:
                state[name] = None
        return state
