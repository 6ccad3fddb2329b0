package osftrt_test

import (
	"errors"
	"testing"

	"libosftrt/osftrt"
)

// The layer's counters (library 1.3.0): the dense strategy rebuilds W once
// and keeps it while the trainable factors are unchanged; MarkUpdated
// bumps TrainableVersion and forces the next rebuild; the hybrid strategy
// computes the forward as the dense one. Every forward is checked against
// x W^T in float64.
func TestFLinearInfoAndMarkUpdated(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	if d := osftrt.DefaultFLinearOptions(); d.TrainableUpdates != osftrt.UpdatesDetected {
		t.Fatalf("default TrainableUpdates %v", d.TrainableUpdates)
	}
	const N, K, M = 10, 14, 6
	w := rnd(N*K, 1)
	bad := osftrt.DefaultFLinearOptions()
	bad.TrainableUpdates = osftrt.Updates(7)
	if _, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(w, N, K), &bad); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("TrainableUpdates 7: %v", err)
	}
	opts := osftrt.DefaultFLinearOptions()
	opts.Strategy = osftrt.StrategyDense
	opts.TrainableUpdates = osftrt.UpdatesReported
	layer, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(w, N, K), &opts)
	if err != nil {
		t.Fatal(err)
	}
	info := func() osftrt.FLinearInfo {
		t.Helper()
		in, err := layer.Info()
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	x := rnd(M*K, 1)
	want := matmul(f64(x), M, K, f64(w), N, true)
	forward := func(label string) []float32 {
		t.Helper()
		y := nan32(M * N)
		if err := layer.Forward(osftrt.MustWrap(x, M, K), nil, osftrt.MustWrap(y, M, N)); err != nil {
			t.Fatal(err)
		}
		if e := relErr(y, want); e > 1e-5 {
			t.Errorf("%s forward vs float64 x W^T: %g", label, e)
		}
		return y
	}
	if in := info(); in != (osftrt.FLinearInfo{}) {
		t.Fatalf("a new layer's info %+v, want zeros", in)
	}
	yDense := forward("dense")
	i1 := info()
	if i1.Rebuilds != 1 || i1.FrozenBuilds != 1 || !i1.WeightKept || i1.TrainableVersion != 0 {
		t.Fatalf("after one dense forward: %+v", i1)
	}
	forward("dense, kept W")
	if i2 := info(); i2.Rebuilds != i1.Rebuilds || i2.FrozenBuilds != 1 {
		t.Fatalf("a second forward on unchanged factors rebuilt W: %+v after %+v", i2, i1)
	}
	if err := layer.MarkUpdated(); err != nil {
		t.Fatal(err)
	}
	if i3 := info(); i3.TrainableVersion != i1.TrainableVersion+1 {
		t.Fatalf("MarkUpdated: TrainableVersion %d after %d", i3.TrainableVersion, i1.TrainableVersion)
	}
	forward("dense after MarkUpdated")
	i4 := info()
	if i4.Rebuilds != i1.Rebuilds+1 {
		t.Fatalf("the forward after MarkUpdated: rebuilds %d, want %d", i4.Rebuilds, i1.Rebuilds+1)
	}
	// reading a trainable factor takes a view of it: a report too
	if _, _, err := osftrt.ReadFactor[float32](layer, osftrt.FactorSLow); err != nil {
		t.Fatal(err)
	}
	if i5 := info(); i5.TrainableVersion != i4.TrainableVersion+1 {
		t.Fatalf("ReadFactor(SLow): TrainableVersion %d after %d", i5.TrainableVersion, i4.TrainableVersion)
	}
	// hybrid: the dense forward
	if err := layer.SetStrategy(osftrt.StrategyHybrid); err != nil {
		t.Fatal(err)
	}
	if s, err := layer.ChooseStrategy(M, osftrt.PassBackward); err != nil || s != osftrt.StrategyHybrid {
		t.Fatalf("ChooseStrategy after SetStrategy(Hybrid): %v %v", s, err)
	}
	if e := relErr(forward("hybrid"), f64(yDense)); e > 1e-6 {
		t.Errorf("hybrid vs dense forward: %g", e)
	}
	if err := layer.Close(); err != nil {
		t.Fatal(err)
	}
	var e *osftrt.Error
	if err := layer.MarkUpdated(); !errors.Is(err, osftrt.ErrInvalidHandle) || !errors.As(err, &e) || e.Op != "FLinear.MarkUpdated" {
		t.Fatalf("MarkUpdated after Close: %v", err)
	}
	if in, err := layer.Info(); !errors.Is(err, osftrt.ErrInvalidHandle) || in != (osftrt.FLinearInfo{}) {
		t.Fatalf("Info after Close: %+v %v", in, err)
	}
}

// The MLP's plan (library 1.3.0): the tiling agrees with TileCount and
// with a forced tile count; AUTO tiling recomputes, a budget holding every
// tile's intermediates keeps gate and up (M*I*4 bytes each for fp32
// SwiGLU), a budget below it recomputes; bad arguments are refused.
func TestMLPPlan(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const H, I, M = 16, 24, 29
	mk := func(rows, cols int64) *osftrt.CTensor {
		ct, err := osftrt.NewCTensor(osftrt.Float32, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		copy(ct.Float32s(), rnd(int(rows*cols), 0.3))
		return ct
	}
	w := osftrt.MLPWeights{Gate: osftrt.Projection{Weight: mk(I, H)}, Up: osftrt.Projection{Weight: mk(I, H)},
		Down: osftrt.Projection{Weight: mk(H, I)}}
	newMLP := func(o *osftrt.MLPOptions) *osftrt.MLP {
		t.Helper()
		m, err := osftrt.NewMLP(ctx, osftrt.SwiGLU, H, I, w, o)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	mlp := newMLP(&osftrt.MLPOptions{Tiling: osftrt.TilingTokens, TileTokens: 8})
	n, tt, err := mlp.TileCount(M)
	if err != nil {
		t.Fatal(err)
	}
	p, err := mlp.Plan(M, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.NumTiles != n || p.TileTokens != tt || p.NumTiles != 4 || p.TileTokens != 8 {
		t.Fatalf("Plan(%d, 0) %+v, TileCount %d %d, want 4 tiles of 8", M, p, n, tt)
	}
	if !p.Recompute || p.KeptBytes != 0 {
		t.Fatalf("token tiling keeps nothing: %+v", p)
	}
	if p, err := mlp.Plan(M, 3); err != nil || p.NumTiles != 3 || p.TileTokens != (M+2)/3 {
		t.Fatalf("Plan(%d, 3): %+v %v", M, p, err)
	}
	if _, err := mlp.Plan(-1, 0); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("Plan(-1, 0): %v", err)
	}
	if _, err := mlp.Plan(M, -1); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("Plan(M, -1): %v", err)
	}
	if err := mlp.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := mlp.Plan(M, 0); !errors.Is(err, osftrt.ErrInvalidHandle) {
		t.Fatalf("Plan after Close: %v", err)
	}
	const kept = M * I * 4 * 2 // gate and up outputs, fp32
	big := newMLP(&osftrt.MLPOptions{Tiling: osftrt.TilingBudget, MemoryBudget: 1 << 26})
	defer big.Close()
	if p, err := big.Plan(M, 0); err != nil || p.Recompute || p.KeptBytes != kept || p.NumTiles != 1 || p.TileTokens != M {
		t.Fatalf("a budget holding every tile: %+v %v, want kept %d in 1 tile", p, err, kept)
	}
	small := newMLP(&osftrt.MLPOptions{Tiling: osftrt.TilingBudget, MemoryBudget: kept / 4})
	defer small.Close()
	if p, err := small.Plan(M, 0); err != nil || !p.Recompute || p.KeptBytes != 0 || p.NumTiles < 1 ||
		p.TileTokens < 1 || p.TileTokens*p.NumTiles < M {
		t.Fatalf("a budget below every tile: %+v %v", p, err)
	}
}
