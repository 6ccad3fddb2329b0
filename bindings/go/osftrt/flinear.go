package osftrt

import (
	"runtime"
	"unsafe"

	"libosftrt/osftrt/internal/capi"
)

// Strategy is how an OSFT layer computes (osft_flinear_strategy_t).
type Strategy int

// Strategies.
var (
	StrategyAuto       = Strategy(capi.OSFT_FLINEAR_AUTO)
	StrategyFactorized = Strategy(capi.OSFT_FLINEAR_FACTORIZED)
	StrategyDense      = Strategy(capi.OSFT_FLINEAR_DENSE)
	// StrategyHybrid: the dense forward and grad_x, the trainable factors'
	// gradients from the factors (library 1.3.0).
	StrategyHybrid = Strategy(capi.OSFT_FLINEAR_HYBRID)
)

// Updates is how a layer learns that its trainable factors changed
// (osft_flinear_updates_t, library 1.3.0).
type Updates int

// Ways a layer learns of changes to its trainable factors.
var (
	// UpdatesDetected: the runtime finds out by itself (fingerprints on
	// the CPU; a rebuild at every call elsewhere). The default.
	UpdatesDetected = Updates(capi.OSFT_FLINEAR_UPDATES_DETECTED)
	// UpdatesReported: the caller reports every change (MarkUpdated;
	// ReadFactor, WriteFactor or FactorShape of U_low, S_low or V_low
	// count as one: they take a view) and the rebuilt W is kept until the
	// next report.
	UpdatesReported = Updates(capi.OSFT_FLINEAR_UPDATES_REPORTED)
)

// Factor names one of the six factors (osft_flinear_factor_t).
type Factor int

// Factors.
var (
	FactorUHigh = Factor(capi.OSFT_FACTOR_U_HIGH)
	FactorSHigh = Factor(capi.OSFT_FACTOR_S_HIGH)
	FactorVHigh = Factor(capi.OSFT_FACTOR_V_HIGH)
	FactorULow  = Factor(capi.OSFT_FACTOR_U_LOW)
	FactorSLow  = Factor(capi.OSFT_FACTOR_S_LOW)
	FactorVLow  = Factor(capi.OSFT_FACTOR_V_LOW)
)

// Pass is the pass a strategy query is about.
type Pass int

// Passes.
var (
	PassForward  = Pass(capi.OSFT_FLINEAR_FORWARD)
	PassBackward = Pass(capi.OSFT_FLINEAR_BACKWARD)
)

// Accumulate bits of FLinearGrads.Accumulate.
var (
	FLinearAccumulateGradX    = uint32(capi.OSFT_FLINEAR_ACCUMULATE_GRAD_X)
	FLinearAccumulateGradULow = uint32(capi.OSFT_FLINEAR_ACCUMULATE_GRAD_U_LOW)
	FLinearAccumulateGradSLow = uint32(capi.OSFT_FLINEAR_ACCUMULATE_GRAD_S_LOW)
	FLinearAccumulateGradVLow = uint32(capi.OSFT_FLINEAR_ACCUMULATE_GRAD_V_LOW)
	FLinearAccumulateGradBias = uint32(capi.OSFT_FLINEAR_ACCUMULATE_GRAD_BIAS)
)

// FLinearOptions configure a layer (osft_flinear_options_t); the defaults
// (DefaultFLinearOptions) are rank ratio 0.5, strategy AUTO, factors in the
// weight's dtype (FactorDType 0), trainable updates detected.
type FLinearOptions struct {
	RankRatio        float64
	Strategy         Strategy
	FactorDType      DType   // Float32, BFloat16, or 0: the weight's
	TrainableUpdates Updates // library 1.3.0
}

// DefaultFLinearOptions returns the defaults of osft_flinear_options_init.
func DefaultFLinearOptions() FLinearOptions {
	o := capi.NewOsft_flinear_options_t()
	defer capi.DeleteOsft_flinear_options_t(o)
	dt := o.GetFactor_dtype()
	fd, _ := dtypeFromDL(dt.GetCode(), dt.GetBits())
	if dt.GetBits() == 0 {
		fd = 0
	}
	return FLinearOptions{RankRatio: o.GetRank_ratio(), Strategy: Strategy(o.GetStrategy()), FactorDType: fd,
		TrainableUpdates: Updates(o.GetTrainable_updates())}
}

func flinearOptionsToC(opts *FLinearOptions) capi.Osft_flinear_options_t {
	o := DefaultFLinearOptions()
	if opts != nil {
		o = *opts
	}
	co := capi.NewOsft_flinear_options_t()
	co.SetRank_ratio(o.RankRatio)
	co.SetStrategy(capi.Enum_SS_osft_flinear_strategy_e(o.Strategy))
	co.SetTrainable_updates(capi.Enum_SS_osft_flinear_updates_e(o.TrainableUpdates))
	if o.FactorDType != 0 {
		dt := co.GetFactor_dtype() // a view of the struct member
		code, bits := o.FactorDType.dl()
		dt.SetCode(code)
		dt.SetBits(bits)
		dt.SetLanes(1)
	}
	return co
}

// FLinear is a factorized linear (OSFT) layer (include/osftrt/flinear.h).
type FLinear struct {
	handle
}

func newFLinear(ctx *Context, op string, code int, opts *FLinearOptions, args *[numSlots]Arg, keeps []*CTensor) (*FLinear, error) {
	co := flinearOptionsToC(opts)
	defer capi.DeleteOsft_flinear_options_t(co)
	c, err := ctx.lock(op)
	if err != nil {
		return nil, err
	}
	defer ctx.mu.Unlock()
	b := ctx.buf
	b.reset()
	b.h[0] = uint64(c)
	b.h[1] = uint64(co.Swigcptr())
	if err := ctx.call(op, code, args); err != nil {
		return nil, err
	}
	l := &FLinear{}
	l.adopt(ctx, uintptr(b.out[0]), "FLinear", capi.Osft_flinear_destroy)
	if err := l.keep(keeps...); err != nil { // cannot fail: describe checked them
		return nil, err
	}
	runtime.SetFinalizer(l, func(l *FLinear) { _ = l.Close() })
	return l, nil
}

// NewFLinear decomposes the dense weight (N x K; fp32, fp64 or bf16) into
// runtime-owned factors (fp64 SVD) and creates a layer over them.
func NewFLinear(ctx *Context, weight Arg, opts *FLinearOptions) (*FLinear, error) {
	return newFLinear(ctx, "NewFLinear", capi.OSFTGO_FLINEAR_CREATE_WEIGHT, opts,
		&[numSlots]Arg{argOf(weight)}, nil)
}

// FLinearFactors are caller-owned factors. The layer keeps their addresses,
// so they must be in C memory (CTensor): U_* N x r / N x l, S_* vectors,
// V_* r x K / l x K, one dtype (fp32 or bf16).
type FLinearFactors struct {
	UHigh, SHigh, VHigh, ULow, SLow, VLow *CTensor
}

// NewFLinearFromFactors creates a layer over caller-owned factors, which
// stay in use (CTensor.Free refuses) until the layer is closed. The
// optimizer may update the trainable ones in place between calls.
func NewFLinearFromFactors(ctx *Context, f FLinearFactors, opts *FLinearOptions) (*FLinear, error) {
	ts := []*CTensor{f.UHigh, f.SHigh, f.VHigh, f.ULow, f.SLow, f.VLow}
	for _, t := range ts {
		if t == nil {
			return nil, errArg("NewFLinearFromFactors", "all six factors are required")
		}
	}
	return newFLinear(ctx, "NewFLinearFromFactors", capi.OSFTGO_FLINEAR_CREATE_FACTORS, opts,
		&[numSlots]Arg{ts[0], ts[1], ts[2], ts[3], ts[4], ts[5]}, ts)
}

// Close destroys the layer (and its runtime-owned factors). It fails while
// an open MLP or Projector uses the layer. Idempotent.
func (l *FLinear) Close() error { return l.close() }

func (l *FLinear) raw(op string, f func(p uintptr) capi.Enum_SS_osft_status_e) error {
	p, err := l.begin(op)
	if err != nil {
		return err
	}
	defer l.ctx.mu.Unlock()
	return rawCall(op, func() capi.Enum_SS_osft_status_e { return f(p) })
}

// Dims returns N (out features), K (in features), r (frozen rank), l (trainable rank).
func (l *FLinear) Dims() (n, k, r, lo int64, err error) {
	err = l.raw("FLinear.Dims", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_flinear_get_dims(p, &n, &k, &r, &lo)
	})
	return
}

// SetStrategy sets the strategy of later calls.
func (l *FLinear) SetStrategy(s Strategy) error {
	return l.raw("FLinear.SetStrategy", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_flinear_set_strategy(p, capi.Enum_SS_osft_flinear_strategy_e(s))
	})
}

// ChooseStrategy reports the strategy a call over `tokens` rows would use.
func (l *FLinear) ChooseStrategy(tokens int64, pass Pass) (Strategy, error) {
	var s capi.Enum_SS_osft_flinear_strategy_e
	err := l.raw("FLinear.ChooseStrategy", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_flinear_choose_strategy(p, tokens, capi.Enum_SS_osft_flinear_pass_e(pass), &s)
	})
	return Strategy(int32(s)), err
}

// Refresh drops what was cached from the frozen factors (call after
// changing them).
func (l *FLinear) Refresh() error {
	return l.raw("FLinear.Refresh", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_flinear_refresh(p)
	})
}

// MarkUpdated reports that the trainable factors (U_low, S_low, V_low)
// changed other than through the layer (an optimizer step on caller-owned
// factors): the kept dense W is rebuilt at the next call that needs it.
// Needed only with TrainableUpdates = UpdatesReported, harmless otherwise;
// cheap (no device work), once per optimizer step. Library 1.3.0.
func (l *FLinear) MarkUpdated() error {
	return l.raw("FLinear.MarkUpdated", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_flinear_mark_updated(p)
	})
}

// FLinearInfo is what a layer has done since it was created
// (osft_flinear_info_t, library 1.3.0).
type FLinearInfo struct {
	// Rebuilds of the dense W from the trainable factors (dense and hybrid
	// strategies), kept or into scratch.
	Rebuilds uint64
	// Builds of the frozen product (once, again after Refresh or
	// Redecompose).
	FrozenBuilds uint64
	// Reports of a change of the trainable factors (MarkUpdated, writes
	// or views of trainable factors).
	TrainableVersion uint64
	// WeightKept: a rebuilt W is kept for the next call.
	WeightKept bool
}

// Info returns the layer's counters.
func (l *FLinear) Info() (FLinearInfo, error) {
	s := capi.NewOsft_flinear_info_t() // runs osft_flinear_info_init
	defer capi.DeleteOsft_flinear_info_t(s)
	if err := l.raw("FLinear.Info", func(p uintptr) capi.Enum_SS_osft_status_e {
		return capi.Osft_flinear_get_info(p, s)
	}); err != nil {
		return FLinearInfo{}, err
	}
	return FLinearInfo{Rebuilds: s.GetRebuilds(), FrozenBuilds: s.GetFrozen_builds(),
		TrainableVersion: s.GetTrainable_version(), WeightKept: s.GetWeight_kept() != 0}, nil
}

// factorView describes one factor's memory (owned by the layer or the caller).
type factorView struct {
	dtype  DType
	shape  []int64
	rowStr int64
	data   uintptr
}

func (l *FLinear) factorView(op string, p uintptr, which Factor) (factorView, error) {
	v := capi.NewDLTensor()
	defer capi.DeleteDLTensor(v)
	if err := rawCall(op, func() capi.Enum_SS_osft_status_e {
		return capi.Osft_flinear_get_factor(p, capi.Enum_SS_osft_flinear_factor_e(which), v)
	}); err != nil {
		return factorView{}, err
	}
	dt := v.GetDtype()
	d, ok := dtypeFromDL(dt.GetCode(), dt.GetBits())
	if !ok {
		return factorView{}, &Error{Status: StatusInternalError, Op: op, Message: "unknown factor dtype"}
	}
	nd := v.GetNdim()
	shape := append([]int64(nil), unsafe.Slice(v.GetShape(), nd)...)
	fv := factorView{dtype: d, shape: shape, data: v.GetData()}
	if nd == 2 {
		fv.rowStr = shape[1]
		if st := v.GetStrides(); st != nil {
			fv.rowStr = unsafe.Slice(st, 2)[0]
		}
	}
	return fv, nil
}

// FactorShape is the shape and dtype of one factor.
func (l *FLinear) FactorShape(which Factor) ([]int64, DType, error) {
	p, err := l.begin("FLinear.FactorShape")
	if err != nil {
		return nil, 0, err
	}
	defer l.ctx.mu.Unlock()
	fv, err := l.factorView("FLinear.FactorShape", p, which)
	return fv.shape, fv.dtype, err
}

// copyFactor copies between a factor and a compact Go slice (toGo: out of
// the layer). Under ctx.mu.
func copyFactor[T Element](l *FLinear, op string, which Factor, buf []T, toGo bool) ([]T, []int64, error) {
	p, err := l.begin(op)
	if err != nil {
		return nil, nil, err
	}
	defer l.ctx.mu.Unlock()
	fv, err := l.factorView(op, p, which)
	if err != nil {
		return nil, nil, err
	}
	if fv.dtype != dtypeOf[T]() {
		return nil, nil, &Error{Status: StatusDTypeMismatch, Op: op,
			Message: "the factor is " + fv.dtype.String() + ", not " + dtypeOf[T]().String()}
	}
	rows, cols, rs := int64(1), fv.shape[0], fv.shape[0]
	if len(fv.shape) == 2 {
		rows, cols, rs = fv.shape[0], fv.shape[1], fv.rowStr
	}
	if toGo {
		buf = make([]T, rows*cols)
	} else if int64(len(buf)) != rows*cols {
		return nil, nil, errArg(op, "%d values for a factor of shape %v", len(buf), fv.shape)
	}
	mem := unsafe.Slice((*T)(unsafe.Pointer(fv.data)), (rows-1)*rs+cols)
	for r := int64(0); r < rows; r++ {
		if toGo {
			copy(buf[r*cols:(r+1)*cols], mem[r*rs:r*rs+cols])
		} else {
			copy(mem[r*rs:r*rs+cols], buf[r*cols:(r+1)*cols])
		}
	}
	return buf, fv.shape, nil
}

// ReadFactor copies one factor out of the layer (row-major, compact) and
// returns it with its shape. T must be the factors' element type.
func ReadFactor[T Element](l *FLinear, which Factor) ([]T, []int64, error) {
	return copyFactor[T](l, "ReadFactor", which, nil, true)
}

// WriteFactor copies src (row-major, compact) into one factor of the layer,
// e.g. an optimizer step on runtime-owned factors. After changing a frozen
// factor call Refresh.
func WriteFactor[T Element](l *FLinear, which Factor, src []T) error {
	_, _, err := copyFactor[T](l, "WriteFactor", which, src, false)
	return err
}

// Forward computes y = x W^T + bias (bias may be nil).
func (l *FLinear) Forward(x, bias, y Arg) error {
	p, err := l.begin("FLinear.Forward")
	if err != nil {
		return err
	}
	defer l.ctx.mu.Unlock()
	b := l.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	return l.ctx.call("FLinear.Forward", capi.OSFTGO_FLINEAR_FORWARD,
		&[numSlots]Arg{argOf(x), argOf(bias), argOf(y)})
}

// FLinearGrads are the gradient outputs of Backward (nil: not computed).
type FLinearGrads struct {
	GradX, GradULow, GradSLow, GradVLow, GradBias Arg
	Accumulate                                    uint32 // FLinearAccumulate* bits
}

// Backward computes the requested gradients for one forward (x, grad_y = dL/dy).
func (l *FLinear) Backward(x, gradY Arg, g FLinearGrads) error {
	p, err := l.begin("FLinear.Backward")
	if err != nil {
		return err
	}
	defer l.ctx.mu.Unlock()
	b := l.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	b.i[0] = int64(g.Accumulate)
	return l.ctx.call("FLinear.Backward", capi.OSFTGO_FLINEAR_BACKWARD,
		&[numSlots]Arg{argOf(x), argOf(gradY), argOf(g.GradX), argOf(g.GradULow), argOf(g.GradSLow),
			argOf(g.GradVLow), argOf(g.GradBias)})
}

// Merge writes the dense weight U_high S_high V_high + U_low S_low V_low (N x K).
func (l *FLinear) Merge(weight Arg) error {
	p, err := l.begin("FLinear.Merge")
	if err != nil {
		return err
	}
	defer l.ctx.mu.Unlock()
	b := l.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	return l.ctx.call("FLinear.Merge", capi.OSFTGO_FLINEAR_MERGE, &[numSlots]Arg{argOf(weight)})
}

// Redecompose re-splits the layer from a new dense weight (nil: its current
// merged weight), overwriting the factors in place.
func (l *FLinear) Redecompose(weight Arg) error {
	p, err := l.begin("FLinear.Redecompose")
	if err != nil {
		return err
	}
	defer l.ctx.mu.Unlock()
	b := l.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	return l.ctx.call("FLinear.Redecompose", capi.OSFTGO_FLINEAR_REDECOMPOSE, &[numSlots]Arg{argOf(weight)})
}
