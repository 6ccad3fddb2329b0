package osftrt

import (
	"errors"
	"runtime"
	"runtime/cgo"
	"unsafe"

	"libosftrt/osftrt/internal/capi"
)

// CommEngine is the engine behind a communicator.
type CommEngine int

// Engines.
var (
	EngineSelf      = CommEngine(capi.OSFT_COMM_ENGINE_SELF)
	EngineMPI       = CommEngine(capi.OSFT_COMM_ENGINE_MPI)
	EngineNCCL      = CommEngine(capi.OSFT_COMM_ENGINE_NCCL)
	EngineCallbacks = CommEngine(capi.OSFT_COMM_ENGINE_CALLBACKS)
)

// CommOptions (osft_comm_options_t): DefaultCommOptions gives a timeout of
// 300 s; math.Inf(1) disables it.
type CommOptions struct {
	TimeoutSeconds float64
}

// DefaultCommOptions returns the defaults of osft_comm_options_init.
func DefaultCommOptions() CommOptions {
	o := capi.NewOsft_comm_options_t()
	defer capi.DeleteOsft_comm_options_t(o)
	return CommOptions{TimeoutSeconds: o.GetTimeout_seconds()}
}

func commOptionsToC(opts *CommOptions) capi.Osft_comm_options_t {
	co := capi.NewOsft_comm_options_t()
	if opts != nil {
		co.SetTimeout_seconds(opts.TimeoutSeconds)
	}
	return co
}

// Comm is a communicator (include/osftrt/comm.h).
type Comm struct {
	handle
	user cgo.Handle // callbacks communicators: the Go Collectives
}

func newComm(ctx *Context, op string, opts *CommOptions, create func(c uintptr, co capi.Osft_comm_options_t, out *uintptr) capi.Enum_SS_osft_status_e) (*Comm, error) {
	co := commOptionsToC(opts)
	defer capi.DeleteOsft_comm_options_t(co)
	c, err := ctx.lock(op)
	if err != nil {
		return nil, err
	}
	defer ctx.mu.Unlock()
	var p uintptr
	if err := rawCall(op, func() capi.Enum_SS_osft_status_e { return create(c, co, &p) }); err != nil {
		return nil, err
	}
	m := &Comm{}
	m.adopt(ctx, p, "Comm", capi.Osft_comm_destroy)
	runtime.SetFinalizer(m, func(m *Comm) { _ = m.Close() })
	return m, nil
}

// NewSelfComm creates the one-rank communicator.
func NewSelfComm(ctx *Context, opts *CommOptions) (*Comm, error) {
	return newComm(ctx, "NewSelfComm", opts, func(c uintptr, co capi.Osft_comm_options_t, out *uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_comm_create_self(c, co, out)
	})
}

// NewMPIComm wraps an MPI communicator given by its Fortran handle
// (MPI_Comm_c2f). Collective over the MPI communicator.
func NewMPIComm(ctx *Context, mpiCommF int64, opts *CommOptions) (*Comm, error) {
	return newComm(ctx, "NewMPIComm", opts, func(c uintptr, co capi.Osft_comm_options_t, out *uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_comm_create_mpi(c, mpiCommF, co, out)
	})
}

// NCCLUniqueID is an ncclUniqueId (send it to the other ranks as bytes).
type NCCLUniqueID [128]byte

// NewNCCLUniqueID makes a new NCCL unique id (call on one rank).
func NewNCCLUniqueID() (NCCLUniqueID, error) {
	var id NCCLUniqueID
	u := capi.NewOsft_nccl_unique_id_t()
	defer capi.DeleteOsft_nccl_unique_id_t(u)
	if err := rawCall("NewNCCLUniqueID", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_comm_nccl_unique_id(u)
	}); err != nil {
		return id, err
	}
	copy(id[:], unsafe.Slice((*byte)(unsafe.Pointer(u.Swigcptr())), len(id)))
	return id, nil
}

// NewNCCLComm wraps the caller's ncclComm_t (as uintptr) for a CUDA context.
func NewNCCLComm(ctx *Context, ncclComm uintptr, opts *CommOptions) (*Comm, error) {
	return newComm(ctx, "NewNCCLComm", opts, func(c uintptr, co capi.Osft_comm_options_t, out *uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_comm_create_nccl(c, ncclComm, co, out)
	})
}

// NewNCCLCommFromID creates an NCCL communicator of nranks ranks from id.
func NewNCCLCommFromID(ctx *Context, id NCCLUniqueID, nranks, rank int, opts *CommOptions) (*Comm, error) {
	u := capi.NewOsft_nccl_unique_id_t()
	defer capi.DeleteOsft_nccl_unique_id_t(u)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(u.Swigcptr())), len(id)), id[:])
	return newComm(ctx, "NewNCCLCommFromID", opts, func(c uintptr, co capi.Osft_comm_options_t, out *uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_comm_create_nccl_from_id(c, u, nranks, rank, co, out)
	})
}

// Buffer is library memory lent to a Collectives method for that call only:
// do not keep it, or slices of it, after the method returns.
type Buffer struct {
	DType DType
	Len   int64
	data  unsafe.Pointer
}

// Float32s is the buffer as []float32 (DType Float32), valid during the call.
func (b *Buffer) Float32s() []float32 {
	if b.DType != Float32 {
		panic("osftrt: Buffer is " + b.DType.String())
	}
	return unsafe.Slice((*float32)(b.data), int(b.Len))
}

// BF16s is the buffer as []BF16 (DType BFloat16), valid during the call.
func (b *Buffer) BF16s() []BF16 {
	if b.DType != BFloat16 {
		panic("osftrt: Buffer is " + b.DType.String())
	}
	return unsafe.Slice((*BF16)(b.data), int(b.Len))
}

// Collectives are a framework's collectives, for NewCallbackComm. The
// library calls them on the goroutine's OS thread that called into it,
// while that call holds its context's lock: they must not call osftrt on the
// same context (the C API forbids it; here it would deadlock).
// Return nil, or an error (a *Error with StatusTimeout passes through as a
// timeout; anything else becomes a communication error).
type Collectives interface {
	Rank() int
	Size() int
	// AllreduceSum sums buf over the ranks, in place.
	AllreduceSum(buf *Buffer) error
	// Allgather concatenates counts[p] elements of every rank p into recv.
	Allgather(send, recv *Buffer, counts []int64) error
}

// Barrierer is an optional method of Collectives.
type Barrierer interface {
	Barrier() error
}

func statusOf(err error) uint32 {
	if err == nil {
		return uint32(StatusSuccess)
	}
	var e *Error
	if errors.As(err, &e) {
		return uint32(e.Status)
	}
	return uint32(StatusCommError)
}

func init() {
	capi.CommHooks.Allreduce = func(user uintptr, data unsafe.Pointer, code, bits uint8, n int64) uint32 {
		c := cgo.Handle(user).Value().(Collectives)
		d, _ := dtypeFromDL(code, bits)
		return statusOf(c.AllreduceSum(&Buffer{DType: d, Len: n, data: data}))
	}
	capi.CommHooks.Allgather = func(user uintptr, send, recv unsafe.Pointer, code, bits uint8, sn, rn int64, counts []int64) uint32 {
		c := cgo.Handle(user).Value().(Collectives)
		d, _ := dtypeFromDL(code, bits)
		return statusOf(c.Allgather(&Buffer{DType: d, Len: sn, data: send}, &Buffer{DType: d, Len: rn, data: recv}, counts))
	}
	capi.CommHooks.Barrier = func(user uintptr) uint32 {
		return statusOf(cgo.Handle(user).Value().(Barrierer).Barrier())
	}
	capi.CommHooks.Release = func(user uintptr) { cgo.Handle(user).Delete() }
}

// NewCallbackComm creates a communicator over Go collectives (a framework's
// process group). coll stays referenced until the communicator is closed.
func NewCallbackComm(ctx *Context, coll Collectives, opts *CommOptions) (*Comm, error) {
	if coll == nil {
		return nil, errArg("NewCallbackComm", "nil Collectives")
	}
	cb := capi.NewOsft_comm_callbacks_t()
	defer capi.DeleteOsft_comm_callbacks_t(cb)
	h := cgo.NewHandle(coll)
	_, hasBarrier := coll.(Barrierer)
	capi.FillCommCallbacks(cb.Swigcptr(), uintptr(h), coll.Rank(), coll.Size(), hasBarrier)
	m, err := newComm(ctx, "NewCallbackComm", opts, func(c uintptr, co capi.Osft_comm_options_t, out *uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_comm_create_callbacks(c, cb, co, out)
	})
	if err != nil {
		h.Delete() // the library calls release only for a communicator it created
		return nil, err
	}
	m.user = h
	return m, nil
}

// Close destroys the communicator. It fails while an open Projector or FLCE
// uses it. Idempotent.
func (m *Comm) Close() error { return m.close() }

func (m *Comm) raw(op string, f func(p uintptr) capi.Enum_SS_osft_status_e) error {
	p, err := m.begin(op)
	if err != nil {
		return err
	}
	defer m.ctx.mu.Unlock()
	return rawCall(op, func() capi.Enum_SS_osft_status_e { return f(p) })
}

// Info returns this rank, the number of ranks and the engine.
func (m *Comm) Info() (rank, size int, engine CommEngine, err error) {
	var e capi.Enum_SS_osft_comm_engine_e
	err = m.raw("Comm.Info", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_comm_get_info(p, &rank, &size, &e)
	})
	return int(int32(rank)), int(int32(size)), CommEngine(int32(e)), err
}

// AllreduceSum sums buf over all ranks, in place (fp32 or bf16, compact).
func (m *Comm) AllreduceSum(buf Arg) error {
	p, err := m.begin("Comm.AllreduceSum")
	if err != nil {
		return err
	}
	defer m.ctx.mu.Unlock()
	b := m.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	return m.ctx.call("Comm.AllreduceSum", capi.OSFTGO_COMM_ALLREDUCE, &[numSlots]Arg{argOf(buf)})
}

// Allgather gathers counts[p] elements of every rank p into recv.
func (m *Comm) Allgather(send, recv Arg, counts []int64) error {
	p, err := m.begin("Comm.Allgather")
	if err != nil {
		return err
	}
	defer m.ctx.mu.Unlock()
	if len(counts) == 0 {
		return errArg("Comm.Allgather", "no counts")
	}
	b := m.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	b.i[0] = int64(len(counts))
	// counts travel as slot 2's Go pointer (read during the call only)
	cnt := append([]int64(nil), counts...)
	return m.ctx.callExtra("Comm.Allgather", capi.OSFTGO_COMM_ALLGATHER, &[numSlots]Arg{argOf(send), argOf(recv)},
		2, unsafe.Pointer(&cnt[0]))
}

// Barrier returns when every rank has entered it.
func (m *Comm) Barrier() error {
	return m.raw("Comm.Barrier", func(p uintptr) capi.Enum_SS_osft_status_e { return capi.Osft_comm_barrier(p) })
}

// CommStats counts the collectives since creation or ResetStats.
type CommStats struct {
	AllreduceCalls, AllgatherCalls, BarrierCalls uint64
	AllreduceBytes, AllgatherBytes, Failures     uint64
}

// Stats reads the communicator's statistics.
func (m *Comm) Stats() (CommStats, error) {
	s := capi.NewOsft_comm_stats_t()
	defer capi.DeleteOsft_comm_stats_t(s)
	if err := m.raw("Comm.Stats", func(p uintptr) capi.Enum_SS_osft_status_e { return capi.Osft_comm_get_stats(p, s) }); err != nil {
		return CommStats{}, err
	}
	return CommStats{s.GetAllreduce_calls(), s.GetAllgather_calls(), s.GetBarrier_calls(),
		s.GetAllreduce_bytes(), s.GetAllgather_bytes(), s.GetFailures()}, nil
}

// ResetStats sets every counter to 0.
func (m *Comm) ResetStats() error {
	return m.raw("Comm.ResetStats", func(p uintptr) capi.Enum_SS_osft_status_e { return capi.Osft_comm_reset_stats(p) })
}
