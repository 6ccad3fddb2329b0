package osftrt

import (
	"runtime"
	"sync"
	"unsafe"

	"libosftrt/osftrt/internal/capi"
)

// rawCall runs one SWIG-wrapped C call and reads osft_last_error() on the
// same OS thread (the message is thread-local in C).
func rawCall(op string, f func() capi.Enum_SS_osft_status_e) error {
	runtime.LockOSThread()
	st := f()
	msg := ""
	if st != capi.OSFT_STATUS_SUCCESS {
		msg = capi.Osft_last_error()
	}
	runtime.UnlockOSThread()
	if st == capi.OSFT_STATUS_SUCCESS {
		return nil
	}
	return &Error{Status: Status(st), Op: op, Message: msg}
}

// DeviceType is where a context runs.
type DeviceType int

// Device types (osft_device_type_t).
var (
	DeviceCPU  = DeviceType(capi.OSFT_DEVICE_CPU)
	DeviceCUDA = DeviceType(capi.OSFT_DEVICE_CUDA)
)

// DeviceCount is how many devices of the type this process can use: 1 for
// the CPU; for CUDA the visible GPUs, 0 without a driver, GPU or CUDA build.
func DeviceCount(t DeviceType) (int, error) {
	n := 0
	err := rawCall("DeviceCount", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_device_count(capi.Enum_SS_osft_device_type_e(t), &n)
	})
	return int(int32(n)), err
}

// SetNumThreads sets the library's CPU thread count, process-wide: its
// worker threads and its BLAS engine's (osft_set_num_threads). 0 returns to
// the automatic count (OSFTRT_NUM_THREADS, OMP_NUM_THREADS, the engine's
// variable, else the CPUs of the process's affinity). n < 0 or n > 1024 is
// ErrInvalidArgument. Safe to call from any goroutine. (Library 1.4.)
func SetNumThreads(n int) error {
	if n < -1<<31 || n > 1<<31-1 {
		return errArg("SetNumThreads", "n: %d does not fit a C int", n)
	}
	return rawCall("SetNumThreads", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_set_num_threads(n)
	})
}

// NumThreads is the CPU thread count in effect (osft_get_num_threads).
func NumThreads() (int, error) {
	n := 0
	err := rawCall("NumThreads", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_get_num_threads(&n)
	})
	return int(int32(n)), err
}

// ContextOptions configures NewContext. DefaultContextOptions gives the
// library's defaults (osft_context_options_init): the CPU, device 0, no
// workspace limit, no TF32. A caller allocator is not available from Go (the library
// would call into Go for every allocation); the built-in one is used.
type ContextOptions struct {
	Device         DeviceType
	DeviceID       int
	WorkspaceLimit uint64 // bytes of scratch memory at most; 0: no limit
	AllowTF32      bool   // CUDA: fp32 GEMMs may use TF32 tensor cores (1.1.0)
}

// DefaultContextOptions returns the defaults of osft_context_options_init.
func DefaultContextOptions() ContextOptions {
	o := capi.NewOsft_context_options_t()
	defer capi.DeleteOsft_context_options_t(o)
	return ContextOptions{
		Device:         DeviceType(o.GetDevice_type()),
		DeviceID:       int(o.GetDevice_id()),
		WorkspaceLimit: uint64(o.GetWorkspace_limit()),
		AllowTF32:      o.GetAllow_tf32() != 0,
	}
}

// Context is a libosftrt context: a device, its workspace and memory.
// Every other handle is made from one. Its methods and those of the handles
// made from it are serialized by one mutex (the C thread rule).
type Context struct {
	mu        sync.Mutex
	ptr       uintptr
	children  int
	buf       *callBuf // its own (pointer-free) allocation: cgo checks it quickly
	stage     []byte   // QR lists' Go-slice entries, staged (see qrList)
	descs     []cDesc  // a QR list's descriptors (reused)
	statuses  []uint32 // a QR list's per-matrix statuses (reused)
	rankFlags []int32  // a QR list's osft_qr_options_t.rank_deficient (reused)
}

// reuse returns the first n elements of *buf, reallocated when it is too
// short (never shrunk): the context's per-call scratch, used while the
// caller holds ctx.mu. Contents are whatever the last call left.
func reuse[T any](buf *[]T, n int) []T {
	if cap(*buf) < n {
		*buf = make([]T, n)
	}
	return (*buf)[:n]
}

var versionOnce struct {
	sync.Once
	err error
}

// NewContext creates a context; opts nil means DefaultContextOptions().
// It refuses a library whose version does not fit the headers the binding
// was generated from (CheckVersion).
func NewContext(opts *ContextOptions) (*Context, error) {
	versionOnce.Do(func() { versionOnce.err = CheckVersion() })
	if versionOnce.err != nil {
		return nil, versionOnce.err
	}
	o := DefaultContextOptions()
	if opts != nil {
		o = *opts
	}
	co := capi.NewOsft_context_options_t()
	defer capi.DeleteOsft_context_options_t(co)
	co.SetDevice_type(capi.Enum_SS_osft_device_type_e(o.Device))
	co.SetDevice_id(o.DeviceID)
	co.SetWorkspace_limit(int64(o.WorkspaceLimit))
	if o.AllowTF32 {
		co.SetAllow_tf32(1)
	}
	var p uintptr
	if err := rawCall("NewContext", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_context_create(&p, co)
	}); err != nil {
		return nil, err
	}
	c := &Context{ptr: p, buf: new(callBuf)}
	runtime.SetFinalizer(c, func(c *Context) { _ = c.Close() })
	return c, nil
}

// Close destroys the context. It fails (changing nothing) while handles made
// from it are open. Idempotent.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ptr == 0 {
		return nil
	}
	if c.children > 0 {
		return errArg("Context.Close", "%d handle(s) made from this context are still open; close them first", c.children)
	}
	if err := rawCall("Context.Close", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_context_destroy(c.ptr)
	}); err != nil {
		return err
	}
	c.ptr = 0
	return nil
}

// lock takes the context's mutex and returns its C handle, or an error
// (unlocked) if the context is closed.
func (c *Context) lock(op string) (uintptr, error) {
	c.mu.Lock()
	if c.ptr == 0 {
		c.mu.Unlock()
		return 0, errClosed(op)
	}
	return c.ptr, nil
}

// withContext runs f under the context's lock with the live handle.
func (c *Context) withContext(op string, f func(p uintptr) error) error {
	p, err := c.lock(op)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return f(p)
}

// Device returns the context's device type and ordinal.
func (c *Context) Device() (DeviceType, int, error) {
	var t capi.Enum_SS_osft_device_type_e
	id := 0
	err := c.withContext("Context.Device", func(p uintptr) error {
		return rawCall("Context.Device", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_get_device(p, &t, &id)
		})
	})
	return DeviceType(int32(t)), int(int32(id)), err
}

// SetStream sets the CUDA stream (a cudaStream_t as uintptr; 0: the default
// stream). A CPU context accepts only 0.
func (c *Context) SetStream(stream uintptr) error {
	return c.withContext("Context.SetStream", func(p uintptr) error {
		return rawCall("Context.SetStream", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_set_stream(p, stream)
		})
	})
}

// Stream returns the CUDA stream (0 on the CPU and for the default stream).
func (c *Context) Stream() (uintptr, error) {
	var s uintptr
	err := c.withContext("Context.Stream", func(p uintptr) error {
		return rawCall("Context.Stream", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_get_stream(p, &s)
		})
	})
	return s, err
}

// Synchronize waits for the context's device work (a no-op on the CPU).
func (c *Context) Synchronize() error {
	return c.withContext("Context.Synchronize", func(p uintptr) error {
		return rawCall("Context.Synchronize", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_synchronize(p)
		})
	})
}

// ReserveWorkspace grows the workspace to at least bytes now.
func (c *Context) ReserveWorkspace(bytes uint64) error {
	return c.withContext("Context.ReserveWorkspace", func(p uintptr) error {
		return rawCall("Context.ReserveWorkspace", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_reserve_workspace(p, int64(bytes))
		})
	})
}

// ReleaseWorkspace frees the workspace (grown again on demand).
func (c *Context) ReleaseWorkspace() error {
	return c.withContext("Context.ReleaseWorkspace", func(p uintptr) error {
		return rawCall("Context.ReleaseWorkspace", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_release_workspace(p)
		})
	})
}

// WorkspaceSize is the current workspace size in bytes.
func (c *Context) WorkspaceSize() (uint64, error) {
	var n int64
	err := c.withContext("Context.WorkspaceSize", func(p uintptr) error {
		return rawCall("Context.WorkspaceSize", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_get_workspace_size(p, &n)
		})
	})
	return uint64(n), err
}

// MemoryStats is what the library holds for a context, in bytes.
type MemoryStats struct {
	HostInUse, HostPeak, DeviceInUse, DevicePeak uint64
	HostAllocs, DeviceAllocs, WorkspaceBytes     uint64
}

// MemoryStats reads the context's memory statistics.
func (c *Context) MemoryStats() (MemoryStats, error) {
	s := capi.NewOsft_memory_stats_t()
	defer capi.DeleteOsft_memory_stats_t(s)
	err := c.withContext("Context.MemoryStats", func(p uintptr) error {
		return rawCall("Context.MemoryStats", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_get_memory_stats(p, s)
		})
	})
	if err != nil {
		return MemoryStats{}, err
	}
	return MemoryStats{s.GetHost_in_use(), s.GetHost_peak(), s.GetDevice_in_use(), s.GetDevice_peak(),
		s.GetHost_allocs(), s.GetDevice_allocs(), s.GetWorkspace_bytes()}, nil
}

// ResetPeakMemory sets the peaks to the current in-use values.
func (c *Context) ResetPeakMemory() error {
	return c.withContext("Context.ResetPeakMemory", func(p uintptr) error {
		return rawCall("Context.ResetPeakMemory", func() capi.Enum_SS_osft_status_e {
			return capi.Osft_context_reset_peak_memory(p)
		})
	})
}

// ---------------------------------------------------------------- handles

// handle is the part every handle made from a context shares. Its fields
// are guarded by ctx.mu.
type handle struct {
	ctx     *Context
	ptr     uintptr
	name    string
	users   int       // live handles that use this one
	uses    []*handle // handles this one uses (kept alive, counted)
	keeps   []*CTensor
	destroy func(uintptr) capi.Enum_SS_osft_status_e
}

// adopt registers a newly created C handle (under ctx.mu).
func (h *handle) adopt(c *Context, p uintptr, name string, destroy func(uintptr) capi.Enum_SS_osft_status_e) {
	h.ctx, h.ptr, h.name, h.destroy = c, p, name, destroy
	c.children++
}

// use records that h keeps `other` (under ctx.mu).
func (h *handle) use(other *handle) {
	other.users++
	h.uses = append(h.uses, other)
}

// keep records that h keeps t until it is closed.
func (h *handle) keep(ts ...*CTensor) error {
	for i, t := range ts {
		if t == nil {
			continue
		}
		if err := t.use(); err != nil {
			for _, u := range ts[:i] {
				if u != nil {
					u.unuse()
				}
			}
			return err
		}
	}
	for _, t := range ts {
		if t != nil {
			h.keeps = append(h.keeps, t)
		}
	}
	return nil
}

func (h *handle) close() error {
	if h.ctx == nil {
		return nil
	}
	c := h.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.ptr == 0 {
		return nil
	}
	if h.users > 0 {
		return errArg(h.name+".Close", "still used by %d open handle(s); close those first", h.users)
	}
	if err := rawCall(h.name+".Close", func() capi.Enum_SS_osft_status_e { return h.destroy(h.ptr) }); err != nil {
		return err
	}
	h.ptr = 0
	c.children--
	for _, u := range h.uses {
		u.users--
	}
	for _, t := range h.keeps {
		t.unuse()
	}
	h.uses, h.keeps = nil, nil
	return nil
}

// begin takes the context's lock and returns the handle's C pointer, or an
// error (unlocked) when the handle or its context is closed. Callers defer
// h.ctx.mu.Unlock().
func (h *handle) begin(op string) (uintptr, error) {
	if h == nil || h.ctx == nil {
		return 0, errClosed(op)
	}
	h.ctx.mu.Lock()
	if h.ptr == 0 || h.ctx.ptr == 0 {
		h.ctx.mu.Unlock()
		return 0, errClosed(op)
	}
	return h.ptr, nil
}

// call runs one osftgo_call operation with the tensors of args in their
// slots (nil: absent). Under ctx.mu; b.h and b.i are set by the caller.
func (c *Context) call(op string, code int, args *[numSlots]Arg) error {
	return c.callExtra(op, code, args, -1, nil)
}

// callExtra is call with one more Go pointer, passed as slot k's data
// argument (slot k carries no tensor): the counts of an all-gather.
func (c *Context) callExtra(op string, code int, args *[numSlots]Arg, k int, extra unsafe.Pointer) error {
	var g [numSlots]unsafe.Pointer
	var held [numSlots]*CTensor // used for the call: Free refuses meanwhile
	nh := 0
	defer func() {
		for _, ct := range held[:nh] {
			ct.unuse()
		}
	}()
	b := c.buf
	for j, a := range args {
		if a == nil {
			b.d[j].present = 0
			continue
		}
		if ct, ok := a.(*CTensor); ok {
			if err := ct.use(); err != nil {
				return &Error{Status: StatusInvalidArgument, Op: op, Message: "a CTensor used after Free"}
			}
			held[nh] = ct
			nh++
		}
		p, err := a.describe(&b.d[j])
		if err != nil {
			if e, ok := err.(*Error); ok {
				e.Op = op
			}
			return err
		}
		g[j] = p
	}
	if k >= 0 {
		g[k] = extra
	}
	st := capi.Osftgo_call(code, unsafe.Pointer(b), g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7],
		g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15], g[16], g[17], g[18], g[19])
	runtime.KeepAlive(args)
	runtime.KeepAlive(extra)
	if st != capi.OSFT_STATUS_SUCCESS {
		return &Error{Status: Status(st), Op: op, Message: b.message()}
	}
	return nil
}

// argOf turns a possibly-nil *Tensor / *CTensor inside an Arg into a nil Arg.
func argOf(a Arg) Arg {
	switch t := a.(type) {
	case nil:
		return nil
	case *Tensor:
		if t == nil {
			return nil
		}
	case *CTensor:
		if t == nil {
			return nil
		}
	}
	return a
}

func cArg(t *CTensor) Arg {
	if t == nil {
		return nil
	}
	return t
}

// Raw is the C handle (osft_context_t), for passing to C code of the
// caller's own; 0 once closed. The caller keeps the thread rule: no C call
// on it while Go calls on this context may run, and not after Close.
func (c *Context) Raw() uintptr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ptr
}

// Raw is the C handle (osft_flce_t, osft_flinear_t, ...), for passing to C
// code of the caller's own; 0 once closed. The same rules as Context.Raw.
func (h *handle) Raw() uintptr {
	if h.ctx == nil {
		return 0
	}
	h.ctx.mu.Lock()
	defer h.ctx.mu.Unlock()
	return h.ptr
}
