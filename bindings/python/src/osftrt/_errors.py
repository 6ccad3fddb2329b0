"""Exceptions: one class per osft_status_t, all subclasses of osftrt.Error.

The classes are made from the OSFT_STATUS_* constants of the C headers, so a
status added to the library gets its class (OSFT_STATUS_FOO_BAR -> FooBar)
without a change here.
"""
from . import capi


class Error(RuntimeError):
    """A libosftrt call failed. .status: the osft_status_t; .message: the
    osft_last_error() text (it names the function and the argument)."""

    def __init__(self, status, message=""):
        super().__init__(message)
        self.status = int(status)
        self.message = message

    @property
    def status_name(self):
        return capi.osft_status_string(self.status)

    def __str__(self):
        return "%s [%s]" % (self.message, capi.osft_status_string(self.status))


Error.__module__ = "osftrt"

# Builtin bases where one fits, so generic handlers keep working.
_EXTRA_BASES = {
    "INVALID_ARGUMENT": (ValueError,),
    "INDEX_OUT_OF_RANGE": (IndexError,),
    "OUT_OF_MEMORY": (MemoryError,),
    "TIMEOUT": (TimeoutError,),
    "DTYPE_MISMATCH": (TypeError,),
}

_by_status = {}
for _name in dir(capi):
    if _name.startswith("OSFT_STATUS_") and _name != "OSFT_STATUS_SUCCESS":
        _short = _name[len("OSFT_STATUS_"):]
        _cls_name = "".join(p.capitalize() for p in _short.split("_"))
        _cls = type(_cls_name, (Error,) + _EXTRA_BASES.get(_short, ()), {"__module__": "osftrt"})
        globals()[_cls_name] = _cls
        _by_status[int(getattr(capi, _name))] = _cls

capi._register_errors(Error, _by_status)


def error_class(status):
    """The exception class of a status (Error for an unknown one)."""
    return _by_status.get(int(status), Error)


InvalidArgument = _by_status[capi.OSFT_STATUS_INVALID_ARGUMENT]
InvalidHandle = _by_status[capi.OSFT_STATUS_INVALID_HANDLE]
InvalidStructSize = _by_status[capi.OSFT_STATUS_INVALID_STRUCT_SIZE]
DtypeMismatch = _by_status[capi.OSFT_STATUS_DTYPE_MISMATCH]
ShapeMismatch = _by_status[capi.OSFT_STATUS_SHAPE_MISMATCH]
BadLayout = _by_status[capi.OSFT_STATUS_BAD_LAYOUT]
DeviceMismatch = _by_status[capi.OSFT_STATUS_DEVICE_MISMATCH]
Aliasing = _by_status[capi.OSFT_STATUS_ALIASING]
IndexOutOfRange = _by_status[capi.OSFT_STATUS_INDEX_OUT_OF_RANGE]
OutOfMemory = _by_status[capi.OSFT_STATUS_OUT_OF_MEMORY]
NoDevice = _by_status[capi.OSFT_STATUS_NO_DEVICE]
NotSupported = _by_status[capi.OSFT_STATUS_NOT_SUPPORTED]
BackendError = _by_status[capi.OSFT_STATUS_BACKEND_ERROR]
CommError = _by_status[capi.OSFT_STATUS_COMM_ERROR]
Timeout = _by_status[capi.OSFT_STATUS_TIMEOUT]
NumericalError = _by_status[capi.OSFT_STATUS_NUMERICAL_ERROR]
InternalError = _by_status[capi.OSFT_STATUS_INTERNAL_ERROR]
