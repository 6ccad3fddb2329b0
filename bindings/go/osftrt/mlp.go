package osftrt

import (
	"runtime"

	"libosftrt/osftrt/internal/capi"
)

// Variant is the MLP's structure (osft_mlp_variant_t).
type Variant int

// Variants.
var (
	SwiGLU    = Variant(capi.OSFT_MLP_SWIGLU)
	GeGLUTanh = Variant(capi.OSFT_MLP_GEGLU_TANH)
	GeGLUErf  = Variant(capi.OSFT_MLP_GEGLU_ERF)
	GELUTanh  = Variant(capi.OSFT_MLP_GELU_TANH)
	GELUErf   = Variant(capi.OSFT_MLP_GELU_ERF)
	SiLU      = Variant(capi.OSFT_MLP_SILU)
	ReLU      = Variant(capi.OSFT_MLP_RELU)
)

// Tiling is the tile-size rule (osft_mlp_tiling_t).
type Tiling int

// Tiling rules.
var (
	TilingAuto   = Tiling(capi.OSFT_MLP_TILING_AUTO)
	TilingTokens = Tiling(capi.OSFT_MLP_TILING_TOKENS)
	TilingBudget = Tiling(capi.OSFT_MLP_TILING_BUDGET)
)

// MLPOptions (osft_mlp_options_t); defaults: AUTO tiling, compute dtype
// from the weights (DType 0).
type MLPOptions struct {
	Tiling       Tiling
	TileTokens   int64
	MemoryBudget uint64
	DType        DType // Float32, BFloat16 or 0
}

// DefaultMLPOptions returns the defaults of osft_mlp_options_init.
func DefaultMLPOptions() MLPOptions {
	o := capi.NewOsft_mlp_options_t()
	defer capi.DeleteOsft_mlp_options_t(o)
	dt := o.GetDtype()
	d, _ := dtypeFromDL(dt.GetCode(), dt.GetBits())
	if dt.GetBits() == 0 {
		d = 0
	}
	return MLPOptions{Tiling: Tiling(o.GetTiling()), TileTokens: o.GetTile_tokens(),
		MemoryBudget: uint64(o.GetMemory_budget()), DType: d}
}

// Projection is one projection of an MLP: a dense weight in C memory (the
// MLP keeps its address) or an FLinear layer; exactly one.
type Projection struct {
	Weight *CTensor
	Layer  *FLinear
}

// MLPWeights are the projections and optional biases (C memory, kept).
type MLPWeights struct {
	Gate, Up, Down             Projection // Gate: gated variants only
	GateBias, UpBias, DownBias *CTensor
}

// MLP is a tiled MLP (include/osftrt/mlp.h).
type MLP struct {
	handle
}

// NewMLP creates a tiled MLP with hidden size H and intermediate size I.
// Weights and layers stay in use until the MLP is closed.
func NewMLP(ctx *Context, v Variant, hidden, intermediate int64, w MLPWeights, opts *MLPOptions) (*MLP, error) {
	o := DefaultMLPOptions()
	if opts != nil {
		o = *opts
	}
	co := capi.NewOsft_mlp_options_t()
	defer capi.DeleteOsft_mlp_options_t(co)
	co.SetTiling(capi.Enum_SS_osft_mlp_tiling_e(o.Tiling))
	co.SetTile_tokens(o.TileTokens)
	co.SetMemory_budget(int64(o.MemoryBudget))
	if o.DType != 0 {
		dt := co.GetDtype()
		code, bits := o.DType.dl()
		dt.SetCode(code)
		dt.SetBits(bits)
		dt.SetLanes(1)
	}
	c, err := ctx.lock("NewMLP")
	if err != nil {
		return nil, err
	}
	defer ctx.mu.Unlock()
	b := ctx.buf
	b.reset()
	b.h[0] = uint64(c)
	b.h[1] = uint64(co.Swigcptr())
	var layers []*handle
	for k, pr := range []Projection{w.Gate, w.Up, w.Down} {
		if pr.Layer != nil {
			if pr.Layer.ctx != ctx || pr.Layer.ptr == 0 {
				return nil, errArg("NewMLP", "a layer is closed or belongs to another context")
			}
			b.h[2+k] = uint64(pr.Layer.ptr)
			layers = append(layers, &pr.Layer.handle)
		}
	}
	b.i[0] = int64(v)
	b.i[1] = hidden
	b.i[2] = intermediate
	ts := []*CTensor{w.Gate.Weight, w.Up.Weight, w.Down.Weight, w.GateBias, w.UpBias, w.DownBias}
	if err := ctx.call("NewMLP", capi.OSFTGO_MLP_CREATE, &[numSlots]Arg{cArg(ts[0]), cArg(ts[1]), cArg(ts[2]),
		cArg(ts[3]), cArg(ts[4]), cArg(ts[5])}); err != nil {
		return nil, err
	}
	m := &MLP{}
	m.adopt(ctx, uintptr(b.out[0]), "MLP", capi.Osft_mlp_destroy)
	for _, l := range layers {
		m.use(l)
	}
	if err := m.keep(ts...); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(m, func(m *MLP) { _ = m.Close() })
	return m, nil
}

// Close destroys the MLP (not its weights or layers). Idempotent.
func (m *MLP) Close() error { return m.close() }

// TileCount is the number of tiles (and the largest tile) of a call over
// `tokens` rows with numTiles 0.
func (m *MLP) TileCount(tokens int64) (numTiles, tileTokens int64, err error) {
	p, err := m.begin("MLP.TileCount")
	if err != nil {
		return 0, 0, err
	}
	defer m.ctx.mu.Unlock()
	err = rawCall("MLP.TileCount", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_mlp_get_tile_count(p, tokens, &numTiles, &tileTokens)
	})
	return
}

// MLPPlan is how calls over a number of tokens are carried out
// (osft_mlp_plan_t, library 1.3.0).
type MLPPlan struct {
	NumTiles   int64 // tiles of the calls
	TileTokens int64 // the most tokens in one tile
	// Recompute: the backward recomputes each tile's forward; false: the
	// forward keeps its gate and up outputs for the backward (TilingBudget
	// with a budget that holds every tile's intermediates).
	Recompute bool
	KeptBytes uint64 // bytes the forward keeps for the backward (0 when recomputing)
}

// Plan reports how a forward and backward over `tokens` rows with numTiles
// tiles (0: the MLP's rule, as TileCount) are carried out.
func (m *MLP) Plan(tokens, numTiles int64) (MLPPlan, error) {
	p, err := m.begin("MLP.Plan")
	if err != nil {
		return MLPPlan{}, err
	}
	defer m.ctx.mu.Unlock()
	s := capi.NewOsft_mlp_plan_t() // runs osft_mlp_plan_init
	defer capi.DeleteOsft_mlp_plan_t(s)
	if err := rawCall("MLP.Plan", func() capi.Enum_SS_osft_status_e {
		return capi.Osft_mlp_get_plan(p, tokens, numTiles, s)
	}); err != nil {
		return MLPPlan{}, err
	}
	return MLPPlan{NumTiles: s.GetNum_tiles(), TileTokens: s.GetTile_tokens(), Recompute: s.GetRecompute() != 0,
		KeptBytes: uint64(s.GetKept_bytes())}, nil
}

// Forward computes y = MLP(x) over numTiles tiles (0: the MLP's rule).
func (m *MLP) Forward(x, y Arg, numTiles int64) error {
	p, err := m.begin("MLP.Forward")
	if err != nil {
		return err
	}
	defer m.ctx.mu.Unlock()
	b := m.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	b.i[0] = numTiles
	return m.ctx.call("MLP.Forward", capi.OSFTGO_MLP_FORWARD, &[numSlots]Arg{argOf(x), argOf(y)})
}

// FactorGrads are the factor gradients of a projection that is a layer.
type FactorGrads struct {
	GradULow, GradSLow, GradVLow Arg
	Accumulate                   uint32 // FLinearAccumulateGrad{U,S,V}Low bits
}

// MLPGrads are the gradient outputs of Backward (nil: not computed).
type MLPGrads struct {
	GradX                                  Arg
	GradGate, GradUp, GradDown             Arg // dense projections
	GradGateBias, GradUpBias, GradDownBias Arg
	GateFactors, UpFactors, DownFactors    *FactorGrads // layer projections
	Accumulate                             uint32       // MLPAccumulate* bits
}

// Accumulate bits of MLPGrads.Accumulate.
var (
	MLPAccumulateGradX        = uint32(capi.OSFT_MLP_ACCUMULATE_GRAD_X)
	MLPAccumulateGradGate     = uint32(capi.OSFT_MLP_ACCUMULATE_GRAD_GATE)
	MLPAccumulateGradUp       = uint32(capi.OSFT_MLP_ACCUMULATE_GRAD_UP)
	MLPAccumulateGradDown     = uint32(capi.OSFT_MLP_ACCUMULATE_GRAD_DOWN)
	MLPAccumulateGradGateBias = uint32(capi.OSFT_MLP_ACCUMULATE_GRAD_GATE_BIAS)
	MLPAccumulateGradUpBias   = uint32(capi.OSFT_MLP_ACCUMULATE_GRAD_UP_BIAS)
	MLPAccumulateGradDownBias = uint32(capi.OSFT_MLP_ACCUMULATE_GRAD_DOWN_BIAS)
)

// Backward computes the gradients for one forward (x, grad_y = dL/dy).
func (m *MLP) Backward(x, gradY Arg, g MLPGrads, numTiles int64) error {
	p, err := m.begin("MLP.Backward")
	if err != nil {
		return err
	}
	defer m.ctx.mu.Unlock()
	b := m.ctx.buf
	b.reset()
	b.h[0] = uint64(p)
	b.i[0] = int64(g.Accumulate)
	b.i[1] = numTiles
	args := [numSlots]Arg{argOf(x), argOf(gradY), argOf(g.GradX), argOf(g.GradGate), argOf(g.GradUp),
		argOf(g.GradDown), argOf(g.GradGateBias), argOf(g.GradUpBias), argOf(g.GradDownBias)}
	for j, f := range []*FactorGrads{g.GateFactors, g.UpFactors, g.DownFactors} {
		if f == nil {
			continue
		}
		b.h[1+j] = 1
		b.i[2] |= int64(f.Accumulate&0xff) << (8 * j)
		args[9+3*j], args[10+3*j], args[11+3*j] = argOf(f.GradULow), argOf(f.GradSLow), argOf(f.GradVLow)
	}
	return m.ctx.call("MLP.Backward", capi.OSFTGO_MLP_BACKWARD, &args)
}
