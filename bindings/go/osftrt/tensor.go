package osftrt

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"

	"libosftrt/osftrt/internal/capi"
)

// DType is a tensor element type.
type DType int

// Element types. BFloat16 values are stored as their 16 bits (BF16).
const (
	Float32 DType = iota + 1
	Float64
	BFloat16
	Int32
	Int64
)

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case BFloat16:
		return "bfloat16"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// Size is the element size in bytes.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	case BFloat16:
		return 2
	}
	return 0
}

// DLPack type codes (dlpack.h).
const (
	dlInt    = 0
	dlFloat  = 2
	dlBfloat = 4
)

func (d DType) dl() (code, bits uint8) {
	switch d {
	case Float32:
		return dlFloat, 32
	case Float64:
		return dlFloat, 64
	case BFloat16:
		return dlBfloat, 16
	case Int32:
		return dlInt, 32
	case Int64:
		return dlInt, 64
	}
	return 255, 0
}

func dtypeFromDL(code, bits uint8) (DType, bool) {
	for _, d := range []DType{Float32, Float64, BFloat16, Int32, Int64} {
		if c, b := d.dl(); c == code && b == bits {
			return d, true
		}
	}
	return 0, false
}

// BF16 is a bfloat16 value (its 16 bits).
type BF16 uint16

// ToBF16 rounds to the nearest bfloat16 (ties to even).
func ToBF16(f float32) BF16 {
	u := math.Float32bits(f)
	if f != f {
		return BF16(0x7fc0)
	}
	u += 0x7fff + ((u >> 16) & 1)
	return BF16(u >> 16)
}

// Float32 widens exactly.
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// Element is a Go type that maps to a DType.
type Element interface {
	float32 | float64 | int32 | int64 | BF16
}

func dtypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case int32:
		return Int32
	case int64:
		return Int64
	case BF16:
		return BFloat16
	}
	panic("unreachable")
}

// Arg is a tensor argument of a call: a *Tensor (Go memory, this call only)
// or a *CTensor (C memory). Only this package implements it.
type Arg interface {
	describe(d *cDesc) (goData unsafe.Pointer, err error)
	Shape() []int64
	DType() DType
}

// cDesc mirrors osftgo_desc_t (bindings/go/swig/osftrt_go.i): a tensor
// without pointers into Go memory.
type cDesc struct {
	data       uint64
	present    int64
	ndim       int32
	code, bits uint8
	lanes      uint16
	shape      [maxDims]int64
	strides    [maxDims]int64
	hasStrides int64
}

const (
	maxDims  = 8
	numSlots = 20
)

// callBuf mirrors osftgo_call_t: the per-call buffer (one per Context, used
// under its mutex; Go memory without pointers, passed to the one C call).
type callBuf struct {
	d   [numSlots]cDesc
	h   [6]uint64
	i   [4]int64
	out [8]int64
	err [1024]byte
}

func (b *callBuf) reset() {
	for k := range b.d {
		b.d[k].present = 0
	}
	b.h = [6]uint64{}
	b.i = [4]int64{}
	b.err[0] = 0
}

func (b *callBuf) message() string {
	n := 0
	for n < len(b.err) && b.err[n] != 0 {
		n++
	}
	return string(b.err[:n])
}

// extent is the number of elements the described memory spans.
func extent(shape, strides []int64) (int64, error) {
	if len(shape) > maxDims {
		return 0, fmt.Errorf("%d dimensions, at most %d", len(shape), maxDims)
	}
	n := int64(1)
	for _, s := range shape {
		if s < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if s == 0 {
			return 0, nil
		}
	}
	if strides == nil {
		for _, s := range shape {
			n *= s
		}
		return n, nil
	}
	if len(strides) != len(shape) {
		return 0, fmt.Errorf("%d strides for %d dimensions", len(strides), len(shape))
	}
	last := int64(0)
	for k, s := range shape {
		if strides[k] < 0 {
			return 0, fmt.Errorf("negative stride in %v", strides)
		}
		last += (s - 1) * strides[k]
	}
	return last + 1, nil
}

func fillDesc(d *cDesc, dt DType, shape, strides []int64) {
	d.ndim = int32(len(shape))
	d.code, d.bits = dt.dl()
	d.lanes = 1
	copy(d.shape[:], shape)
	if strides != nil {
		copy(d.strides[:], strides)
		d.hasStrides = 1
	} else {
		d.hasStrides = 0
	}
}

// Tensor describes a Go slice as a tensor for the duration of one call.
// The slice is referenced by the Tensor, so it stays alive while the Tensor
// is in use; the library never keeps its address.
type Tensor struct {
	dtype   DType
	shape   []int64
	strides []int64
	ptr     unsafe.Pointer
	keep    interface{}
}

// Wrap describes data as a tensor of the given shape (row-major, compact).
// len(data) must cover the shape.
func Wrap[T Element](data []T, shape ...int64) (*Tensor, error) {
	return WrapStrided(data, shape, nil)
}

// MustWrap is Wrap that panics on a bad shape (for literals in tests and
// examples).
func MustWrap[T Element](data []T, shape ...int64) *Tensor {
	t, err := Wrap(data, shape...)
	if err != nil {
		panic(err)
	}
	return t
}

// WrapStrided describes data with explicit element strides (nil: compact),
// e.g. a matrix with padded rows: strides {rowStride, 1}.
func WrapStrided[T Element](data []T, shape, strides []int64) (*Tensor, error) {
	n, err := extent(shape, strides)
	if err != nil {
		return nil, errArg("Wrap", "%v", err)
	}
	if int64(len(data)) < n {
		return nil, errArg("Wrap", "slice of %d elements for shape %v (needs %d)", len(data), shape, n)
	}
	t := &Tensor{dtype: dtypeOf[T](), shape: append([]int64(nil), shape...), keep: data}
	if strides != nil {
		t.strides = append([]int64(nil), strides...)
	}
	if len(data) > 0 {
		t.ptr = unsafe.Pointer(&data[0])
	}
	return t, nil
}

// Shape returns the shape (a copy).
func (t *Tensor) Shape() []int64 { return append([]int64(nil), t.shape...) }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

func (t *Tensor) describe(d *cDesc) (unsafe.Pointer, error) {
	if t == nil {
		d.present = 0
		return nil, nil
	}
	d.present = 1
	d.data = 0
	fillDesc(d, t.dtype, t.shape, t.strides)
	return t.ptr, nil
}

// CTensor is a tensor in C memory (64-byte aligned, zero-initialized), for
// buffers the library keeps between calls. Read and write it through
// Float32s, Float64s, ... (views of the C memory; valid until Free, so keep
// the CTensor itself referenced while using one), or CopyFrom / CopyTo.
type CTensor struct {
	dtype   DType
	shape   []int64
	strides []int64
	addr    uintptr // set at creation; the memory is freed once state has ctFreed
	n       int64   // elements spanned
	// state: the number of users (open handles that keep the tensor, calls
	// running with it) in the low bits, ctFreed once freed. Free succeeds
	// only from 0 (no user), and use() only before ctFreed, both by CAS, so
	// a tensor cannot be freed while a call or a handle uses it.
	state atomic.Int64
}

const ctFreed = int64(1) << 62

// NewCTensor allocates a compact row-major tensor in C memory.
func NewCTensor(dtype DType, shape ...int64) (*CTensor, error) {
	return NewCTensorStrided(dtype, shape, nil)
}

// NewCTensorStrided allocates a tensor with explicit strides (nil: compact).
func NewCTensorStrided(dtype DType, shape, strides []int64) (*CTensor, error) {
	if dtype.Size() == 0 {
		return nil, errArg("NewCTensor", "unknown dtype %v", dtype)
	}
	n, err := extent(shape, strides)
	if err != nil {
		return nil, errArg("NewCTensor", "%v", err)
	}
	addr := uintptr(capi.Osftgo_alloc(n * int64(dtype.Size())))
	if addr == 0 {
		return nil, &Error{Status: StatusOutOfMemory, Op: "NewCTensor", Message: "out of C memory"}
	}
	t := &CTensor{dtype: dtype, shape: append([]int64(nil), shape...), addr: addr, n: n}
	if strides != nil {
		t.strides = append([]int64(nil), strides...)
	}
	runtime.SetFinalizer(t, func(t *CTensor) { _ = t.Free() }) // unreachable: no user left
	return t, nil
}

// Shape returns the shape (a copy).
func (t *CTensor) Shape() []int64 { return append([]int64(nil), t.shape...) }

// Strides returns the strides (nil: compact).
func (t *CTensor) Strides() []int64 { return append([]int64(nil), t.strides...) }

// DType returns the element type.
func (t *CTensor) DType() DType { return t.dtype }

// Len is the number of elements the memory spans.
func (t *CTensor) Len() int { return int(t.n) }

func (t *CTensor) describe(d *cDesc) (unsafe.Pointer, error) {
	if t == nil {
		d.present = 0
		return nil, nil
	}
	if t.state.Load()&ctFreed != 0 {
		return nil, errArg("CTensor", "used after Free")
	}
	d.present = 2
	d.data = uint64(t.addr)
	fillDesc(d, t.dtype, t.shape, t.strides)
	return nil, nil
}

// use counts one more user; it fails once the tensor is freed.
func (t *CTensor) use() error {
	for {
		s := t.state.Load()
		if s&ctFreed != 0 {
			return errArg("CTensor", "used after Free")
		}
		if t.state.CompareAndSwap(s, s+1) {
			return nil
		}
	}
}

func (t *CTensor) unuse() { t.state.Add(-1) }

// Free releases the C memory now (the finalizer does it otherwise). It
// fails, changing nothing, while an open handle keeps the tensor or a call
// on another goroutine uses it. Idempotent.
func (t *CTensor) Free() error {
	for {
		s := t.state.Load()
		if s&ctFreed != 0 {
			return nil
		}
		if s != 0 {
			return errArg("CTensor.Free", "the tensor is in use by %d open handle(s) or running call(s); close those first", s)
		}
		if t.state.CompareAndSwap(0, ctFreed) {
			capi.Osftgo_free(uint64(t.addr))
			return nil
		}
	}
}

func cview[T Element](t *CTensor) []T {
	if dtypeOf[T]() != t.dtype {
		panic(fmt.Sprintf("osftrt: CTensor of %v viewed as %v", t.dtype, dtypeOf[T]()))
	}
	if t.state.Load()&ctFreed != 0 {
		panic("osftrt: CTensor used after Free")
	}
	return unsafe.Slice((*T)(unsafe.Pointer(t.addr)), int(t.n))
}

// Float32s is the tensor's memory as a []float32 (the dtype must be Float32).
func (t *CTensor) Float32s() []float32 { return cview[float32](t) }

// Float64s is the tensor's memory as a []float64.
func (t *CTensor) Float64s() []float64 { return cview[float64](t) }

// BF16s is the tensor's memory as a []BF16.
func (t *CTensor) BF16s() []BF16 { return cview[BF16](t) }

// Int32s is the tensor's memory as a []int32.
func (t *CTensor) Int32s() []int32 { return cview[int32](t) }

// Int64s is the tensor's memory as a []int64.
func (t *CTensor) Int64s() []int64 { return cview[int64](t) }

// CopyFrom copies src (len == Len()) into the tensor's memory.
func CopyFrom[T Element](t *CTensor, src []T) error {
	if dtypeOf[T]() != t.dtype || int64(len(src)) != t.n {
		return errArg("CopyFrom", "%d %v values into a CTensor of %d %v", len(src), dtypeOf[T](), t.n, t.dtype)
	}
	copy(cview[T](t), src)
	runtime.KeepAlive(t)
	return nil
}

// CopyTo copies the tensor's memory into a new slice.
func CopyTo[T Element](t *CTensor) ([]T, error) {
	if dtypeOf[T]() != t.dtype {
		return nil, errArg("CopyTo", "a CTensor of %v read as %v", t.dtype, dtypeOf[T]())
	}
	out := append([]T(nil), cview[T](t)...)
	runtime.KeepAlive(t)
	return out, nil
}
