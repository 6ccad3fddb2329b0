"""The library's CPU thread count follows the host's (issue 55).

libosftrt keeps one count per process for its own worker threads and its
BLAS engine (``osft_set_num_threads``, include/osftrt/context.h). In a
PyTorch program that count is PyTorch's: before each library call the
package compares ``torch.get_num_threads()`` with the count it last gave the
library and passes the new one when they differ, so ``torch.set_num_threads``
(including DataLoader workers' 1) reaches the library's threads and its
OpenBLAS, at any time after import. The check costs a dict lookup and one
``torch.get_num_threads()`` per call (well under a microsecond).

The package stops following torch where the caller chose otherwise:
:func:`set_num_threads` with a count (until ``set_num_threads(None)``), or
``OSFTRT_NUM_THREADS`` in the environment (the library reads it itself).
Without torch loaded the library keeps its own count (the environment, else
the CPUs of the process's affinity).
"""
from __future__ import annotations

import os
import sys

from . import capi


def _env_count():
    try:
        n = int(os.environ.get("OSFTRT_NUM_THREADS", ""))
    except ValueError:
        return None
    return n if n >= 1 else None


_pinned = _env_count() is not None  # the caller chose: do not follow torch
_given = None  # the count last given to the library by follow_host()


def follow_host():
    """Gives the library torch's thread count if it changed (call before
    each library call)."""
    global _given
    if _pinned:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return
    n = torch.get_num_threads()
    if n != _given:
        capi.osft_set_num_threads(n)
        _given = n


def set_num_threads(n):
    """Sets the library's CPU thread count (its worker threads and its BLAS
    engine's), process-wide, and stops following torch's; ``None`` (or 0)
    follows torch's again (or, without torch, the library's automatic count:
    the environment, else the CPUs). Raises osftrt.InvalidArgument for a
    count outside [1, 1024]."""
    global _pinned, _given
    if n is None or n == 0:
        capi.osft_set_num_threads(0)  # the library's own count again
        _pinned = _env_count() is not None
        _given = None
        follow_host()
        return
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError("set_num_threads: n must be an int or None, got %r" % (n,))
    capi.osft_set_num_threads(n)
    _pinned = True


def get_num_threads():
    """The library's CPU thread count in effect."""
    follow_host()
    return capi.osft_get_num_threads()
