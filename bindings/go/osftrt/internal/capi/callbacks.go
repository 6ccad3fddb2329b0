package capi

// Hand-written cgo (not SWIG): the C-callable trampolines that call back
// into Go for host-callback communicators and the log sink. SWIG's Go
// module has no way to make a C function pointer that runs a Go function
// (its directors serve C++ virtual methods only), so these few functions
// are written by hand; everything else in this package is SWIG's.

/*
#include <stdint.h>
#include <osftrt/osftrt.h>
void osftgo_fill_callbacks(osft_comm_callbacks_t *cb, uintptr_t user, int rank, int size, int barrier);
osft_status_t osftgo_set_log(int on, int max_level);
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

// CommHooks are set by package osftrt: they run a communicator's Go
// collectives. data points to library memory valid for the call only.
var CommHooks struct {
	Allreduce func(user uintptr, data unsafe.Pointer, code, bits uint8, n int64) uint32
	Allgather func(user uintptr, send unsafe.Pointer, recv unsafe.Pointer, code, bits uint8,
		sendN, recvN int64, counts []int64) uint32
	Barrier func(user uintptr) uint32
	Release func(user uintptr)
}

// LogHook is the Go log sink (set by package osftrt; read from any thread).
var LogHook atomic.Pointer[func(level int, msg string)]

// FillCommCallbacks points the osft_comm_callbacks_t at cb (C memory, a SWIG
// object's address) to the Go trampolines, with user, rank and size.
func FillCommCallbacks(cb uintptr, user uintptr, rank, size int, barrier bool) {
	b := C.int(0)
	if barrier {
		b = 1
	}
	C.osftgo_fill_callbacks((*C.osft_comm_callbacks_t)(unsafe.Pointer(cb)), C.uintptr_t(user), C.int(rank), C.int(size), b)
}

// SetLog installs (on) or removes the Go log sink (LogHook).
func SetLog(on bool, maxLevel int) (status uint32) {
	o := C.int(0)
	if on {
		o = 1
	}
	return uint32(C.osftgo_set_log(o, C.int(maxLevel)))
}

//export osftgoAllreduce
func osftgoAllreduce(user C.uintptr_t, data unsafe.Pointer, code, bits C.uint8_t, n C.int64_t) C.uint32_t {
	return C.uint32_t(CommHooks.Allreduce(uintptr(user), data, uint8(code), uint8(bits), int64(n)))
}

//export osftgoAllgather
func osftgoAllgather(user C.uintptr_t, send, recv unsafe.Pointer, code, bits C.uint8_t, sendN, recvN C.int64_t,
	counts *C.int64_t, nCounts C.int64_t) C.uint32_t {
	c := append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(counts)), int(nCounts))...)
	return C.uint32_t(CommHooks.Allgather(uintptr(user), send, recv, uint8(code), uint8(bits), int64(sendN), int64(recvN), c))
}

//export osftgoBarrier
func osftgoBarrier(user C.uintptr_t) C.uint32_t {
	return C.uint32_t(CommHooks.Barrier(uintptr(user)))
}

//export osftgoRelease
func osftgoRelease(user C.uintptr_t) {
	CommHooks.Release(uintptr(user))
}

//export osftgoLog
func osftgoLog(level C.int, msg *C.char) {
	if f := LogHook.Load(); f != nil {
		(*f)(int(level), C.GoString(msg))
	}
}
