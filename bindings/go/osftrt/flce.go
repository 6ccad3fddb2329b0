package osftrt

import (
	"runtime"

	"libosftrt/osftrt/internal/capi"
)

// Reduction combines per-token losses (osft_flce_reduction_t).
type Reduction int

// Reductions.
var (
	ReduceMean = Reduction(capi.OSFT_FLCE_MEAN)
	ReduceSum  = Reduction(capi.OSFT_FLCE_SUM)
	ReduceNone = Reduction(capi.OSFT_FLCE_NONE)
)

// Accumulator says where bf16 weight gradients are summed (osft_flce_accumulator_t).
type Accumulator int

// Accumulators.
var (
	AccumulatorFP32   = Accumulator(capi.OSFT_FLCE_ACCUMULATOR_FP32)
	AccumulatorOutput = Accumulator(capi.OSFT_FLCE_ACCUMULATOR_OUTPUT)
)

// Chunking is what a call chunks: tokens, or tokens x vocabulary slices
// (osft_flce_chunking_t, library 1.2.0).
type Chunking int

// Chunkings.
var (
	// ChunkingAuto: the planner picks the cheaper plan (the default).
	ChunkingAuto = Chunking(capi.OSFT_FLCE_CHUNKING_AUTO)
	// ChunkingTokens: chunks of tokens over the whole vocabulary (three
	// GEMMs, grad_W summed over the chunks).
	ChunkingTokens = Chunking(capi.OSFT_FLCE_CHUNKING_TOKENS)
	// ChunkingVocab: tiles of tokens x vocabulary slices in two passes
	// (four GEMMs' worth, grad_W written once per token tile).
	ChunkingVocab = Chunking(capi.OSFT_FLCE_CHUNKING_VOCAB)
)

// Accumulate bits of FLCEOutputs.Accumulate.
var (
	FLCEAccumulateGradX      = uint32(capi.OSFT_FLCE_ACCUMULATE_GRAD_X)
	FLCEAccumulateGradWeight = uint32(capi.OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT)
	FLCEAccumulateGradBias   = uint32(capi.OSFT_FLCE_ACCUMULATE_GRAD_BIAS)
)

// FLCEOptions are the settings of an FLCE handle (osft_flce_options_t);
// DefaultFLCEOptions gives the library's defaults: ignore index -100, no
// smoothing, z-loss or softcap, mean reduction, fp32 accumulator, budget 0
// (1 GiB of chunks), no vocab parallelism, targets checked before any
// output is written (DeviceTargetCheck false), the plan chosen by the
// planner (ChunkingAuto, SliceCols 0).
type FLCEOptions struct {
	IgnoreIndex     int64
	LabelSmoothing  float64
	ZLossScale      float64
	Softcap         float64
	Reduction       Reduction
	Accumulator     Accumulator
	MemoryBudget    uint64
	ChunkRows       int64
	Comm            *Comm // vocab parallelism over this communicator (nil: none)
	VocabOffset     int64
	VocabSizeGlobal int64
	// DeviceTargetCheck: out-of-range targets do not fail Compute (the loss
	// becomes NaN); CheckTargets reports them later (1.1.0).
	DeviceTargetCheck bool
	// Chunking: token chunks or vocabulary slices; Plan reports the one a
	// call takes (1.2.0).
	Chunking Chunking
	// SliceCols: the vocabulary plan's classes per slice (0: as the budget
	// allows, balanced) (1.2.0).
	SliceCols int64
}

// DefaultFLCEOptions returns the defaults of osft_flce_options_init.
func DefaultFLCEOptions() FLCEOptions {
	o := capi.NewOsft_flce_options_t()
	defer capi.DeleteOsft_flce_options_t(o)
	return flceOptionsFromC(o)
}

func flceOptionsFromC(o capi.Osft_flce_options_t) FLCEOptions {
	return FLCEOptions{
		IgnoreIndex: o.GetIgnore_index(), LabelSmoothing: o.GetLabel_smoothing(),
		ZLossScale: o.GetZ_loss_scale(), Softcap: o.GetSoftcap(),
		Reduction: Reduction(o.GetReduction()), Accumulator: Accumulator(o.GetAccumulator()),
		MemoryBudget: uint64(o.GetMemory_budget()), ChunkRows: o.GetChunk_rows(),
		VocabOffset: o.GetVocab_offset(), VocabSizeGlobal: o.GetVocab_size_global(),
		DeviceTargetCheck: o.GetDevice_target_check() != 0,
		Chunking:          Chunking(o.GetChunking()), SliceCols: o.GetSlice_cols(),
	}
}

// FLCE is a fused linear cross-entropy handle: the loss of x W^T + b against
// class targets without materializing the logits (include/osftrt/flce.h).
type FLCE struct {
	handle
	comm *Comm
}

// NewFLCE creates a handle; opts nil means DefaultFLCEOptions().
func NewFLCE(ctx *Context, opts *FLCEOptions) (*FLCE, error) {
	o := DefaultFLCEOptions()
	if opts != nil {
		o = *opts
	}
	co := capi.NewOsft_flce_options_t()
	defer capi.DeleteOsft_flce_options_t(co)
	co.SetIgnore_index(o.IgnoreIndex)
	co.SetLabel_smoothing(o.LabelSmoothing)
	co.SetZ_loss_scale(o.ZLossScale)
	co.SetSoftcap(o.Softcap)
	co.SetReduction(capi.Enum_SS_osft_flce_reduction_e(o.Reduction))
	co.SetAccumulator(capi.Enum_SS_osft_flce_accumulator_e(o.Accumulator))
	co.SetMemory_budget(int64(o.MemoryBudget))
	co.SetChunk_rows(o.ChunkRows)
	co.SetVocab_offset(o.VocabOffset)
	co.SetVocab_size_global(o.VocabSizeGlobal)
	if o.DeviceTargetCheck {
		co.SetDevice_target_check(1)
	}
	co.SetChunking(capi.Enum_SS_osft_flce_chunking_e(o.Chunking))
	co.SetSlice_cols(o.SliceCols)
	c, err := ctx.lock("NewFLCE")
	if err != nil {
		return nil, err
	}
	defer ctx.mu.Unlock()
	if o.Comm != nil {
		if o.Comm.ctx != ctx || o.Comm.ptr == 0 {
			return nil, errArg("NewFLCE", "Options.Comm is closed or belongs to another context")
		}
		co.SetComm(o.Comm.ptr)
	}
	var p uintptr
	if err := rawCall("NewFLCE", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_flce_create(c, co, &p)
	}); err != nil {
		return nil, err
	}
	f := &FLCE{comm: o.Comm}
	f.adopt(ctx, p, "FLCE", capi.Osft_flce_destroy)
	if o.Comm != nil {
		f.use(&o.Comm.handle)
	}
	runtime.SetFinalizer(f, func(f *FLCE) { _ = f.Close() })
	return f, nil
}

// Close destroys the handle. Idempotent.
func (f *FLCE) Close() error { return f.close() }

// Options returns the handle's options as the library read them.
func (f *FLCE) Options() (FLCEOptions, error) {
	p, err := f.begin("FLCE.Options")
	if err != nil {
		return FLCEOptions{}, err
	}
	defer f.ctx.mu.Unlock()
	co := capi.NewOsft_flce_options_t()
	defer capi.DeleteOsft_flce_options_t(co)
	if err := rawCall("FLCE.Options", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_flce_get_options(p, co)
	}); err != nil {
		return FLCEOptions{}, err
	}
	o := flceOptionsFromC(co)
	o.Comm = f.comm
	return o, nil
}

// FLCEInputs are the inputs of a call (osft_flce_inputs_t). X, Weight and
// Targets are required; the rest may be nil.
type FLCEInputs struct {
	X           Arg // (..., H) fp32 or bf16
	Weight      Arg // (V, H), X's dtype
	Targets     Arg // X's leading dims, int32 or int64 class ids
	Bias        Arg // (V) optional
	ClassWeight Arg // (V) fp32, optional
	GradLoss    Arg // upstream gradient, optional
}

// FLCEOutputs are the outputs of a call (osft_flce_outputs_t); nil ones are
// not computed, at least one is required.
type FLCEOutputs struct {
	Loss, GradX, GradWeight, GradBias, ZLoss, Accuracy, Argmax, TokenLoss Arg
	Accumulate                                                            uint32 // FLCEAccumulate* bits
}

func (f *FLCE) prepare(in *FLCEInputs, out *FLCEOutputs, p uintptr) *[numSlots]Arg {
	b := f.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	b.i[0] = int64(out.Accumulate)
	return &[numSlots]Arg{argOf(in.X), argOf(in.Weight), argOf(in.Targets), argOf(in.Bias),
		argOf(in.ClassWeight), argOf(in.GradLoss), argOf(out.Loss), argOf(out.GradX),
		argOf(out.GradWeight), argOf(out.GradBias), argOf(out.ZLoss), argOf(out.Accuracy),
		argOf(out.Argmax), argOf(out.TokenLoss)}
}

// Compute runs one fused linear cross-entropy call (osft_flce_compute).
func (f *FLCE) Compute(in FLCEInputs, out FLCEOutputs) error {
	p, err := f.begin("FLCE.Compute")
	if err != nil {
		return err
	}
	defer f.ctx.mu.Unlock()
	return f.ctx.call("FLCE.Compute", capi.OSFTGO_FLCE_COMPUTE, f.prepare(&in, &out, p))
}

// FLCEPlan describes what a call would do (osft_flce_get_plan). With
// ChunkingVocab, ChunkRows and Chunks are the token tiles, each cut into
// Slices slices of SliceCols classes (the last may have fewer); the token
// plan has Slices 1 and SliceCols V.
type FLCEPlan struct {
	Tokens, ChunkRows, Chunks int64
	ScratchBytes, BudgetBytes uint64
	Chunking                  Chunking // ChunkingTokens or ChunkingVocab, never ChunkingAuto (1.2.0)
	Slices, SliceCols         int64    // (1.2.0)
}

// Plan validates a call as Compute would and reports its chunking.
func (f *FLCE) Plan(in FLCEInputs, out FLCEOutputs) (FLCEPlan, error) {
	p, err := f.begin("FLCE.Plan")
	if err != nil {
		return FLCEPlan{}, err
	}
	defer f.ctx.mu.Unlock()
	if err := f.ctx.call("FLCE.Plan", capi.OSFTGO_FLCE_PLAN, f.prepare(&in, &out, p)); err != nil {
		return FLCEPlan{}, err
	}
	o := f.ctx.buf.out
	return FLCEPlan{o[0], o[1], o[2], uint64(o[3]), uint64(o[4]), Chunking(o[5]), o[6], o[7]}, nil
}

// CheckTargets reports, and clears, the out-of-range target recorded by a
// handle created with DeviceTargetCheck (an error matching
// ErrIndexOutOfRange that names the call, token and target); nil when there
// was none, and always nil without DeviceTargetCheck.
func (f *FLCE) CheckTargets() error {
	p, err := f.begin("FLCE.CheckTargets")
	if err != nil {
		return err
	}
	defer f.ctx.mu.Unlock()
	return rawCall("FLCE.CheckTargets", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_flce_check_targets(p)
	})
}
