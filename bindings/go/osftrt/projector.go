package osftrt

import (
	"runtime"

	"libosftrt/osftrt/internal/capi"
)

// ShardLayout is how one part of a projection target is spread over ranks.
type ShardLayout int

// Layouts.
var (
	ShardReplicated = ShardLayout(capi.OSFT_SHARD_REPLICATED)
	ShardURows      = ShardLayout(capi.OSFT_SHARD_U_ROWS)
	ShardVRows      = ShardLayout(capi.OSFT_SHARD_V_ROWS)
	ShardVCols      = ShardLayout(capi.OSFT_SHARD_V_COLS)
)

// Arithmetic is how the update x -= U_high C (or x -= C V_high) multiplies
// (osft_projection_arithmetic_t, library 1.2.0); C itself is always
// accumulated in fp32.
type Arithmetic int

// Arithmetics.
var (
	// ArithmeticAuto follows each gradient's or factor's dtype: fp32 gets
	// the exact update, bf16 one bf16 GEMM where bf16 GEMMs are native
	// (the default).
	ArithmeticAuto = Arithmetic(capi.OSFT_PROJECTION_ARITHMETIC_AUTO)
	// ArithmeticExact: C to about fp32 accuracy.
	ArithmeticExact = Arithmetic(capi.OSFT_PROJECTION_ARITHMETIC_EXACT)
	// ArithmeticFP32: one fp32 GEMM (TF32 on CUDA when the context allows it).
	ArithmeticFP32 = Arithmetic(capi.OSFT_PROJECTION_ARITHMETIC_FP32)
	// ArithmeticBF16: one bf16 GEMM against C rounded to bf16 (parts with
	// fp32 U_high / V_high use ArithmeticFP32).
	ArithmeticBF16 = Arithmetic(capi.OSFT_PROJECTION_ARITHMETIC_BF16)
)

// ProjectorOptions (osft_projector_options_t); default: check consistency,
// ArithmeticAuto.
type ProjectorOptions struct {
	CheckConsistency bool
	Arithmetic       Arithmetic // the update's arithmetic for every target (1.2.0)
}

// DefaultProjectorOptions returns the defaults of osft_projector_options_init.
func DefaultProjectorOptions() ProjectorOptions {
	o := capi.NewOsft_projector_options_t()
	defer capi.DeleteOsft_projector_options_t(o)
	return ProjectorOptions{CheckConsistency: o.GetCheck_consistency() != 0,
		Arithmetic: Arithmetic(o.GetArithmetic())}
}

// Projector projects OSFT gradients (and parameters) out of the frozen
// subspace (include/osftrt/projection.h). Everything registered is kept
// (C memory, layers, the communicator) until the projector is closed.
type Projector struct {
	handle
	shards []*CTensor
}

// NewProjector creates a projector; comm nil means one rank.
func NewProjector(ctx *Context, comm *Comm, opts *ProjectorOptions) (*Projector, error) {
	o := DefaultProjectorOptions()
	if opts != nil {
		o = *opts
	}
	co := capi.NewOsft_projector_options_t()
	defer capi.DeleteOsft_projector_options_t(co)
	if o.CheckConsistency {
		co.SetCheck_consistency(1)
	} else {
		co.SetCheck_consistency(0)
	}
	co.SetArithmetic(capi.Enum_SS_osft_projection_arithmetic_e(o.Arithmetic))
	c, err := ctx.lock("NewProjector")
	if err != nil {
		return nil, err
	}
	defer ctx.mu.Unlock()
	var cp uintptr
	if comm != nil {
		if comm.ctx != ctx || comm.ptr == 0 {
			return nil, errArg("NewProjector", "the communicator is closed or belongs to another context")
		}
		cp = comm.ptr
	}
	var p uintptr
	if err := rawCall("NewProjector", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_projector_create(c, cp, co, &p)
	}); err != nil {
		return nil, err
	}
	pr := &Projector{}
	pr.adopt(ctx, p, "Projector", capi.Osft_projector_destroy)
	if comm != nil {
		pr.use(&comm.handle)
	}
	runtime.SetFinalizer(pr, func(pr *Projector) { _ = pr.Close() })
	return pr, nil
}

// Close destroys the projector and releases what it kept. Idempotent.
func (pr *Projector) Close() error {
	if err := pr.close(); err != nil {
		return err
	}
	for _, s := range pr.shards {
		_ = s.Free()
	}
	pr.shards = nil
	return nil
}

// AddLayer registers a layer as a replicated target with its factor
// gradients (C memory, each optional); returns the target's index.
func (pr *Projector) AddLayer(l *FLinear, gradULow, gradVLow *CTensor) (int64, error) {
	p, err := pr.begin("Projector.AddLayer")
	if err != nil {
		return -1, err
	}
	defer pr.ctx.mu.Unlock()
	if l == nil || l.ctx != pr.ctx || l.ptr == 0 {
		return -1, errArg("Projector.AddLayer", "the layer is closed or belongs to another context")
	}
	b := pr.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	b.h[1] = uint64(l.ptr)
	if err := pr.ctx.call("Projector.AddLayer", capi.OSFTGO_PROJECTOR_ADD_LAYER,
		&[numSlots]Arg{cArg(gradULow), cArg(gradVLow)}); err != nil {
		return -1, err
	}
	pr.use(&l.handle)
	if err := pr.keep(gradULow, gradVLow); err != nil {
		return -1, err
	}
	return b.out[0], nil
}

// ProjectionTarget is one target as this rank holds it (C memory).
type ProjectionTarget struct {
	UHigh, GradULow, ULow *CTensor
	ULayout               ShardLayout
	UShards               []int64 // one entry per rank (nil for replicated)
	VHigh, GradVLow, VLow *CTensor
	VLayout               ShardLayout
	VShards               []int64
}

// AddTarget registers a target; returns its index.
func (pr *Projector) AddTarget(t ProjectionTarget) (int64, error) {
	p, err := pr.begin("Projector.AddTarget")
	if err != nil {
		return -1, err
	}
	defer pr.ctx.mu.Unlock()
	var shards [2]*CTensor
	for k, s := range [][]int64{t.UShards, t.VShards} {
		if len(s) == 0 {
			continue
		}
		ct, err := NewCTensor(Int64, int64(len(s)))
		if err != nil {
			return -1, err
		}
		copy(ct.Int64s(), s)
		shards[k] = ct
	}
	b := pr.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	for k, s := range shards {
		if s != nil {
			b.h[1+k] = uint64(s.addr)
		}
	}
	b.i[0], b.i[1] = int64(t.ULayout), int64(len(t.UShards))
	b.i[2], b.i[3] = int64(t.VLayout), int64(len(t.VShards))
	ts := []*CTensor{t.UHigh, t.GradULow, t.ULow, t.VHigh, t.GradVLow, t.VLow}
	if err := pr.ctx.call("Projector.AddTarget", capi.OSFTGO_PROJECTOR_ADD_TARGET, &[numSlots]Arg{
		cArg(ts[0]), cArg(ts[1]), cArg(ts[2]), cArg(ts[3]), cArg(ts[4]), cArg(ts[5])}); err != nil {
		for _, s := range shards {
			if s != nil {
				_ = s.Free()
			}
		}
		return -1, err
	}
	if err := pr.keep(ts...); err != nil {
		return -1, err
	}
	for _, s := range shards {
		if s != nil {
			pr.shards = append(pr.shards, s)
		}
	}
	return b.out[0], nil
}

// SetGrads rebinds the gradients of target index (nil: no gradient). The
// old ones stay referenced until the projector is closed.
func (pr *Projector) SetGrads(index int64, gradULow, gradVLow *CTensor) error {
	p, err := pr.begin("Projector.SetGrads")
	if err != nil {
		return err
	}
	defer pr.ctx.mu.Unlock()
	b := pr.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	b.i[0] = index
	if err := pr.ctx.call("Projector.SetGrads", capi.OSFTGO_PROJECTOR_SET_GRADS,
		&[numSlots]Arg{cArg(gradULow), cArg(gradVLow)}); err != nil {
		return err
	}
	return pr.keep(gradULow, gradVLow)
}

func (pr *Projector) raw(op string, f func(p uintptr) capi.Enum_SS_osft_status_e) error {
	p, err := pr.begin(op)
	if err != nil {
		return err
	}
	defer pr.ctx.mu.Unlock()
	return rawCall(op, func() capi.Enum_SS_osft_status_e { return f(p) })
}

// Prepare runs the one-time setup collectives now, if pending.
func (pr *Projector) Prepare() error {
	return pr.raw("Projector.Prepare", func(p uintptr) capi.Enum_SS_osft_status_e { return capi.Osft_projector_prepare(p) })
}

// Invalidate drops the gathered V_high (after frozen factors changed).
func (pr *Projector) Invalidate() error {
	return pr.raw("Projector.Invalidate", func(p uintptr) capi.Enum_SS_osft_status_e { return capi.Osft_projector_invalidate(p) })
}

// Project projects every registered gradient, in place.
func (pr *Projector) Project() error {
	return pr.raw("Projector.Project", func(p uintptr) capi.Enum_SS_osft_status_e { return capi.Osft_projector_project(p) })
}

// ProjectParams projects every registered trainable factor, in place.
func (pr *Projector) ProjectParams() error {
	return pr.raw("Projector.ProjectParams", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_projector_project_params(p)
	})
}

// Orthogonality returns max |U_high^T U_low| and max |V_low V_high^T|.
func (pr *Projector) Orthogonality() (maxU, maxV float64, err error) {
	err = pr.raw("Projector.Orthogonality", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_projector_orthogonality(p, &maxU, &maxV)
	})
	return
}

// ProjectorInfo is what a projector holds and does per call
// (osft_projector_info_t).
type ProjectorInfo struct {
	Targets, ReducedElements, CollectivesPerProject int64
	CoefficientBytes, GatheredBytes                 uint64
	SetupPending                                    bool
	// What the last Project or ProjectParams call did (0 before the first;
	// library 1.2.0): GEMMs computed, backend GEMM calls (a batched GEMM
	// over targets of the same shapes counts 1), conversions/splits/adds,
	// collectives launched (setup included), and waits for the device (0
	// on the steady path).
	LastGemms, LastGemmCalls, LastElementwiseCalls, LastCollectives, LastHostWaits int64
}

// Info describes the projector.
func (pr *Projector) Info() (ProjectorInfo, error) {
	s := capi.NewOsft_projector_info_t()
	defer capi.DeleteOsft_projector_info_t(s)
	if err := pr.raw("Projector.Info", func(p uintptr) capi.Enum_SS_osft_status_e { return capi.Osft_projector_get_info(p, s) }); err != nil {
		return ProjectorInfo{}, err
	}
	return ProjectorInfo{s.GetTargets(), s.GetReduced_elements(), s.GetCollectives_per_project(),
		s.GetCoefficient_bytes(), s.GetGathered_bytes(), s.GetSetup_pending() != 0,
		s.GetLast_gemms(), s.GetLast_gemm_calls(), s.GetLast_elementwise_calls(),
		s.GetLast_collectives(), s.GetLast_host_waits()}, nil
}
