package osftrt

import (
	"fmt"

	"libosftrt/osftrt/internal/capi"
)

// Status is a libosftrt status code (osft_status_t). Values are the C
// enumerators' (read from the library's headers through SWIG).
type Status uint32

// The status codes of include/osftrt/status.h.
var (
	StatusSuccess           = Status(capi.OSFT_STATUS_SUCCESS)
	StatusInvalidArgument   = Status(capi.OSFT_STATUS_INVALID_ARGUMENT)
	StatusInvalidHandle     = Status(capi.OSFT_STATUS_INVALID_HANDLE)
	StatusInvalidStructSize = Status(capi.OSFT_STATUS_INVALID_STRUCT_SIZE)
	StatusDTypeMismatch     = Status(capi.OSFT_STATUS_DTYPE_MISMATCH)
	StatusShapeMismatch     = Status(capi.OSFT_STATUS_SHAPE_MISMATCH)
	StatusBadLayout         = Status(capi.OSFT_STATUS_BAD_LAYOUT)
	StatusDeviceMismatch    = Status(capi.OSFT_STATUS_DEVICE_MISMATCH)
	StatusAliasing          = Status(capi.OSFT_STATUS_ALIASING)
	StatusIndexOutOfRange   = Status(capi.OSFT_STATUS_INDEX_OUT_OF_RANGE)
	StatusOutOfMemory       = Status(capi.OSFT_STATUS_OUT_OF_MEMORY)
	StatusNoDevice          = Status(capi.OSFT_STATUS_NO_DEVICE)
	StatusNotSupported      = Status(capi.OSFT_STATUS_NOT_SUPPORTED)
	StatusBackendError      = Status(capi.OSFT_STATUS_BACKEND_ERROR)
	StatusCommError         = Status(capi.OSFT_STATUS_COMM_ERROR)
	StatusTimeout           = Status(capi.OSFT_STATUS_TIMEOUT)
	StatusNumericalError    = Status(capi.OSFT_STATUS_NUMERICAL_ERROR)
	StatusInternalError     = Status(capi.OSFT_STATUS_INTERNAL_ERROR)
)

// String is the library's short name of the status, e.g. "shape mismatch"
// (osft_status_string).
func (s Status) String() string {
	return capi.Osft_status_string(capi.Enum_SS_osft_status_e(s))
}

// Error is a failure reported by libosftrt.
type Error struct {
	Status  Status // what kind of failure
	Op      string // the Go method that failed, e.g. "FLCE.Compute"
	Message string // the library's message: names the argument and the reason
}

func (e *Error) Error() string {
	if e.Op == "" && e.Message == "" {
		return "osftrt: " + e.Status.String()
	}
	return fmt.Sprintf("osftrt: %s: %s (%s)", e.Op, e.Message, e.Status.String())
}

// Is makes errors.Is(err, ErrShapeMismatch) true for every *Error of that
// status: a sentinel (no Op, no Message) matches by status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Op == "" && t.Message == "" {
		return t.Status == e.Status
	}
	return *t == *e
}

// Sentinels, one per failure status, for errors.Is.
var (
	ErrInvalidArgument   = &Error{Status: StatusInvalidArgument}
	ErrInvalidHandle     = &Error{Status: StatusInvalidHandle}
	ErrInvalidStructSize = &Error{Status: StatusInvalidStructSize}
	ErrDTypeMismatch     = &Error{Status: StatusDTypeMismatch}
	ErrShapeMismatch     = &Error{Status: StatusShapeMismatch}
	ErrBadLayout         = &Error{Status: StatusBadLayout}
	ErrDeviceMismatch    = &Error{Status: StatusDeviceMismatch}
	ErrAliasing          = &Error{Status: StatusAliasing}
	ErrIndexOutOfRange   = &Error{Status: StatusIndexOutOfRange}
	ErrOutOfMemory       = &Error{Status: StatusOutOfMemory}
	ErrNoDevice          = &Error{Status: StatusNoDevice}
	ErrNotSupported      = &Error{Status: StatusNotSupported}
	ErrBackendError      = &Error{Status: StatusBackendError}
	ErrCommError         = &Error{Status: StatusCommError}
	ErrTimeout           = &Error{Status: StatusTimeout}
	ErrNumericalError    = &Error{Status: StatusNumericalError}
	ErrInternalError     = &Error{Status: StatusInternalError}
)

// errClosed is the error of a call on a closed handle.
func errClosed(op string) error {
	return &Error{Status: StatusInvalidHandle, Op: op, Message: "the handle is closed"}
}

// errArg is an argument error found by the Go layer before any C call.
func errArg(op, format string, args ...interface{}) error {
	return &Error{Status: StatusInvalidArgument, Op: op, Message: fmt.Sprintf(format, args...)}
}
