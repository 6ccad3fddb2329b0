package osftrt_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"libosftrt/osftrt"
)

var rng = rand.New(rand.NewSource(20241125))

// rnd: fresh random values in [-s, s], never zero.
func rnd(n int, s float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		x := (rng.Float64()*2 - 1) * s
		if math.Abs(x) < 1e-3*s {
			x = 1e-3 * s
		}
		v[i] = float32(x)
	}
	return v
}

func nan32(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.NaN())
	}
	return v
}

func f64(v []float32) []float64 {
	o := make([]float64, len(v))
	for i, x := range v {
		o[i] = float64(x)
	}
	return o
}

// relErr = max |got - want| / max |want|.
func relErr(got []float32, want []float64) float64 {
	num, den := 0.0, 0.0
	for i := range want {
		num = math.Max(num, math.Abs(float64(got[i])-want[i]))
		den = math.Max(den, math.Abs(want[i]))
	}
	if len(got) != len(want) || math.IsNaN(num) {
		return math.Inf(1)
	}
	return num / math.Max(den, 1e-300)
}

// matmul: C (m x n) = A (m x k) * B (k x n), or with B given as n x k (bT).
func matmul(a []float64, m, k int, b []float64, n int, bT bool) []float64 {
	c := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := 0.0
			for p := 0; p < k; p++ {
				if bT {
					s += a[i*k+p] * b[j*k+p]
				} else {
					s += a[i*k+p] * b[p*n+j]
				}
			}
			c[i*n+j] = s
		}
	}
	return c
}

func transpose(a []float64, m, n int) []float64 {
	t := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			t[j*m+i] = a[i*n+j]
		}
	}
	return t
}

// Both plans (token chunks; tiles of tokens x vocabulary slices) give the
// float64 reference's loss and gradients, and Plan reports the plan taken.
func TestFLCEAgainstFloat64(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const M, H, V = 13, 24, 50
	const a = 0.1 // label smoothing
	x, w := rnd(M*H, 1), rnd(V*H, 1)
	y := make([]int64, M)
	for i := range y {
		y[i] = int64(rng.Intn(V))
	}
	y[4] = -100 // ignored
	// float64 reference
	X, W := f64(x), f64(w)
	Z := matmul(X, M, H, W, V, true) // M x V
	G := make([]float64, M*V)
	total, D := 0.0, 0.0
	for i := 0; i < M; i++ {
		if y[i] == -100 {
			continue
		}
		D++
		z := Z[i*V : (i+1)*V]
		mx := math.Inf(-1)
		for _, v := range z {
			mx = math.Max(mx, v)
		}
		s, sz := 0.0, 0.0
		for _, v := range z {
			s += math.Exp(v - mx)
			sz += v
		}
		lse := mx + math.Log(s)
		total += (1-a)*(lse-z[y[i]]) + a/V*(V*lse-sz)
		for j := 0; j < V; j++ {
			G[i*V+j] = math.Exp(z[j]-lse) - a/V
			if int64(j) == y[i] {
				G[i*V+j] -= 1 - a
			}
		}
	}
	for i := range G {
		G[i] /= D
	}
	wantGX, wantGW := matmul(G, M, V, W, H, false), matmul(transpose(G, M, V), V, M, X, H, false)
	plans := []struct {
		name      string
		chunking  osftrt.Chunking
		chunkRows int64
		sliceCols int64
		want      osftrt.FLCEPlan // Chunking, Chunks, Slices, SliceCols
	}{
		{"default", osftrt.ChunkingAuto, 0, 0, osftrt.FLCEPlan{Chunking: osftrt.ChunkingTokens, Chunks: 1, Slices: 1, SliceCols: V}},
		{"tokens", osftrt.ChunkingTokens, 4, 0, osftrt.FLCEPlan{Chunking: osftrt.ChunkingTokens, Chunks: 4, Slices: 1, SliceCols: V}},
		{"vocab", osftrt.ChunkingVocab, 0, 16, osftrt.FLCEPlan{Chunking: osftrt.ChunkingVocab, Chunks: 1, Slices: 4, SliceCols: 16}},
		{"vocab-tiles", osftrt.ChunkingVocab, 5, 20, osftrt.FLCEPlan{Chunking: osftrt.ChunkingVocab, Chunks: 3, Slices: 3, SliceCols: 20}},
	}
	for _, pc := range plans {
		opts := osftrt.DefaultFLCEOptions()
		if opts.Chunking != osftrt.ChunkingAuto || opts.SliceCols != 0 {
			t.Fatalf("FLCE defaults: chunking %d, slice_cols %d", opts.Chunking, opts.SliceCols)
		}
		opts.LabelSmoothing = a
		opts.Chunking, opts.ChunkRows, opts.SliceCols = pc.chunking, pc.chunkRows, pc.sliceCols
		ce, err := osftrt.NewFLCE(ctx, &opts)
		if err != nil {
			t.Fatal(err)
		}
		if o, err := ce.Options(); err != nil || o.Chunking != pc.chunking || o.SliceCols != pc.sliceCols {
			t.Fatalf("%s: options read back %+v %v", pc.name, o, err)
		}
		in := osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H),
			Targets: osftrt.MustWrap(y, M)}
		loss, gx, gw := nan32(1), nan32(M*H), nan32(V*H)
		out := osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1), GradX: osftrt.MustWrap(gx, M, H),
			GradWeight: osftrt.MustWrap(gw, V, H)}
		if err := ce.Compute(in, out); err != nil {
			t.Fatal(err)
		}
		if e := math.Abs(float64(loss[0])-total/D) / (total / D); e > 1e-5 {
			t.Errorf("%s: loss %v, float64 %v (rel %g)", pc.name, loss[0], total/D, e)
		}
		if e := relErr(gx, wantGX); e > 1e-4 {
			t.Errorf("%s: grad_x rel error %g", pc.name, e)
		}
		if e := relErr(gw, wantGW); e > 1e-4 {
			t.Errorf("%s: grad_weight rel error %g", pc.name, e)
		}
		plan, err := ce.Plan(in, out)
		if err != nil || plan.Tokens != M || plan.Chunking != pc.want.Chunking || plan.Chunks != pc.want.Chunks ||
			plan.Slices != pc.want.Slices || plan.SliceCols != pc.want.SliceCols || plan.ScratchBytes == 0 {
			t.Errorf("%s: plan %+v %v, want %+v", pc.name, plan, err, pc.want)
		}
		if err := ce.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []struct {
		name string
		set  func(*osftrt.FLCEOptions)
	}{
		{"chunking", func(o *osftrt.FLCEOptions) { o.Chunking = 7 }},
		{"slice_cols", func(o *osftrt.FLCEOptions) { o.SliceCols = -1 }},
	} {
		opts := osftrt.DefaultFLCEOptions()
		bad.set(&opts)
		if _, err := osftrt.NewFLCE(ctx, &opts); !errors.Is(err, osftrt.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), bad.name) {
			t.Errorf("NewFLCE with a bad %s: %v", bad.name, err)
		}
	}
}

// Bad inputs give the right *Error and write nothing.
func TestErrorsWriteNothing(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const M, H, V = 4, 8, 12
	x, w := rnd(M*H, 1), rnd(V*H, 1)
	ce, err := osftrt.NewFLCE(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	loss, gx := nan32(1), nan32(M*H)
	run := func(in osftrt.FLCEInputs) error {
		return ce.Compute(in, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1), GradX: osftrt.MustWrap(gx, M, H)})
	}
	cases := []struct {
		name string
		in   osftrt.FLCEInputs
		want *osftrt.Error
	}{
		{"target out of range", osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H),
			Targets: osftrt.MustWrap([]int64{0, 1, V + 3, 2}, M)}, osftrt.ErrIndexOutOfRange},
		{"shape", osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H-1),
			Targets: osftrt.MustWrap([]int64{0, 1, 2, 3}, M)}, osftrt.ErrShapeMismatch},
		{"dtype", osftrt.FLCEInputs{X: osftrt.MustWrap(f64(x), M, H), Weight: osftrt.MustWrap(w, V, H),
			Targets: osftrt.MustWrap([]int64{0, 1, 2, 3}, M)}, osftrt.ErrDTypeMismatch},
		{"column-major layout", osftrt.FLCEInputs{X: mustStrided(x, []int64{M, H}, []int64{1, M}),
			Weight: osftrt.MustWrap(w, V, H), Targets: osftrt.MustWrap([]int64{0, 1, 2, 3}, M)}, osftrt.ErrBadLayout},
		{"missing weight", osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H),
			Targets: osftrt.MustWrap([]int64{0, 1, 2, 3}, M)}, osftrt.ErrInvalidArgument},
	}
	for _, c := range cases {
		copy(loss, nan32(1))
		copy(gx, nan32(M*H))
		err := run(c.in)
		var e *osftrt.Error
		if !errors.Is(err, c.want) || !errors.As(err, &e) || e.Message == "" || e.Op != "FLCE.Compute" {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
			continue
		}
		for _, errs := range []error{osftrt.ErrInvalidArgument, osftrt.ErrShapeMismatch, osftrt.ErrIndexOutOfRange} {
			if errs != c.want && errors.Is(err, errs) {
				t.Errorf("%s: %v also matches %v", c.name, err, errs)
			}
		}
		if !math.IsNaN(float64(loss[0])) {
			t.Errorf("%s: loss written on failure", c.name)
		}
		for _, v := range gx {
			if !math.IsNaN(float64(v)) {
				t.Errorf("%s: grad_x written on failure", c.name)
				break
			}
		}
	}
}

func mustStrided(v []float32, shape, strides []int64) *osftrt.Tensor {
	t, err := osftrt.WrapStrided(v, shape, strides)
	if err != nil {
		panic(err)
	}
	return t
}

// newFactorLayer decomposes a random N x K weight, copies the six factors
// into C memory and builds a layer over those caller-owned factors.
func newFactorLayer(t testing.TB, ctx *osftrt.Context, N, K int64) (*osftrt.FLinear, osftrt.FLinearFactors) {
	t.Helper()
	w := rnd(int(N*K), 1)
	src, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(w, N, K), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var f osftrt.FLinearFactors
	dst := []**osftrt.CTensor{&f.UHigh, &f.SHigh, &f.VHigh, &f.ULow, &f.SLow, &f.VLow}
	for i, which := range []osftrt.Factor{osftrt.FactorUHigh, osftrt.FactorSHigh, osftrt.FactorVHigh,
		osftrt.FactorULow, osftrt.FactorSLow, osftrt.FactorVLow} {
		v, shape, err := osftrt.ReadFactor[float32](src, which)
		if err != nil {
			t.Fatal(err)
		}
		ct, err := osftrt.NewCTensor(osftrt.Float32, shape...)
		if err != nil {
			t.Fatal(err)
		}
		if err := osftrt.CopyFrom(ct, v); err != nil {
			t.Fatal(err)
		}
		*dst[i] = ct
	}
	layer, err := osftrt.NewFLinearFromFactors(ctx, f, nil)
	if err != nil {
		t.Fatal(err)
	}
	return layer, f
}

func TestFLinearAndProjection(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const N, K, M = 12, 16, 9
	w := rnd(N*K, 1)
	layer, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(w, N, K), nil)
	if err != nil {
		t.Fatal(err)
	}
	n, k, r, l, err := layer.Dims()
	if err != nil || n != N || k != K || r+l != N {
		t.Fatalf("dims %d %d %d %d %v", n, k, r, l, err)
	}
	x := rnd(M*K, 1)
	y := nan32(M * N)
	if err := layer.Forward(osftrt.MustWrap(x, M, K), nil, osftrt.MustWrap(y, M, N)); err != nil {
		t.Fatal(err)
	}
	X, W := f64(x), f64(w)
	if e := relErr(y, matmul(X, M, K, W, N, true)); e > 1e-4 {
		t.Errorf("forward rel error %g", e)
	}
	gy := rnd(M*N, 1)
	read := func(which osftrt.Factor) []float64 {
		v, _, err := osftrt.ReadFactor[float32](layer, which)
		if err != nil {
			t.Fatal(err)
		}
		return f64(v)
	}
	Uh, Ul, Sl, Vl := read(osftrt.FactorUHigh), read(osftrt.FactorULow), read(osftrt.FactorSLow), read(osftrt.FactorVLow)
	R, L := int(r), int(l)
	// gradient outputs the projector keeps: C memory
	gU, _ := osftrt.NewCTensor(osftrt.Float32, N, l)
	gV, _ := osftrt.NewCTensor(osftrt.Float32, l, K)
	gS := nan32(L)
	gx := nan32(M * K)
	copy(gU.Float32s(), nan32(N*L))
	copy(gV.Float32s(), nan32(L*K))
	if err := layer.Backward(osftrt.MustWrap(x, M, K), osftrt.MustWrap(gy, M, N), osftrt.FLinearGrads{
		GradX: osftrt.MustWrap(gx, M, K), GradULow: gU, GradSLow: osftrt.MustWrap(gS, l), GradVLow: gV}); err != nil {
		t.Fatal(err)
	}
	GY := f64(gy)
	G := matmul(transpose(GY, M, N), N, M, X, K, false) // N x K = g^T x
	if e := relErr(gx, matmul(GY, M, N, W, K, false)); e > 1e-4 {
		t.Errorf("grad_x rel error %g", e)
	}
	GV := matmul(G, N, K, Vl, L, true) // N x l = G V_low^T
	dU := make([]float64, N*L)
	for i := 0; i < N; i++ {
		for j := 0; j < L; j++ {
			dU[i*L+j] = GV[i*L+j] * Sl[j]
		}
	}
	UG := matmul(transpose(Ul, N, L), L, N, G, K, false) // l x K
	dV := make([]float64, L*K)
	dS := make([]float64, L)
	for i := 0; i < L; i++ {
		for j := 0; j < K; j++ {
			dV[i*K+j] = Sl[i] * UG[i*K+j]
			dS[i] += UG[i*K+j] * Vl[i*K+j]
		}
	}
	if e := relErr(gU.Float32s(), dU); e > 1e-4 {
		t.Errorf("grad_u_low rel error %g", e)
	}
	if e := relErr(gS, dS); e > 1e-4 {
		t.Errorf("grad_s_low rel error %g", e)
	}
	if e := relErr(gV.Float32s(), dV); e > 1e-4 {
		t.Errorf("grad_v_low rel error %g", e)
	}
	// projection: dU <- dU - Uh (Uh^T dU)
	p, err := osftrt.NewProjector(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.AddLayer(layer, gU, gV); err != nil {
		t.Fatal(err)
	}
	if err := layer.Close(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("closing a layer a projector uses: %v", err)
	}
	if err := p.Project(); err != nil {
		t.Fatal(err)
	}
	C := matmul(transpose(Uh, N, R), R, N, dU, L, false)
	P := matmul(Uh, N, R, C, L, false)
	for i := range dU {
		dU[i] -= P[i]
	}
	if e := relErr(gU.Float32s(), dU); e > 1e-4 {
		t.Errorf("projected grad_u_low rel error %g", e)
	}
	res := matmul(transpose(Uh, N, R), R, N, f64(gU.Float32s()), L, false)
	for _, v := range res {
		if math.Abs(v) > 1e-5 {
			t.Fatalf("U_high^T dU_low = %g after projection", v)
		}
	}
	if u, v, err := p.Orthogonality(); err != nil || u > 1e-5 || v > 1e-5 {
		t.Fatalf("orthogonality %g %g %v", u, v, err)
	}
	if info, err := p.Info(); err != nil || info.Targets != 1 {
		t.Fatalf("info %+v %v", info, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := layer.Close(); err != nil {
		t.Fatal(err)
	}
}

func silu(z float64) float64 { return z / (1 + math.Exp(-z)) }

func TestTiledMLPAgainstUntiled(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const H, I, M = 16, 24, 11
	mk := func(rows, cols int64) *osftrt.CTensor {
		ct, err := osftrt.NewCTensor(osftrt.Float32, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		copy(ct.Float32s(), rnd(int(rows*cols), 0.3))
		return ct
	}
	gate, up, down := mk(I, H), mk(I, H), mk(H, I)
	mlp, err := osftrt.NewMLP(ctx, osftrt.SwiGLU, H, I, osftrt.MLPWeights{
		Gate: osftrt.Projection{Weight: gate}, Up: osftrt.Projection{Weight: up}, Down: osftrt.Projection{Weight: down}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mlp.Close()
	if err := gate.Free(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("freeing a weight the MLP keeps: %v", err)
	}
	x := rnd(M*H, 1)
	y3, y1 := nan32(M*H), nan32(M*H)
	if err := mlp.Forward(osftrt.MustWrap(x, M, H), osftrt.MustWrap(y3, M, H), 3); err != nil {
		t.Fatal(err)
	}
	if err := mlp.Forward(osftrt.MustWrap(x, M, H), osftrt.MustWrap(y1, M, H), 1); err != nil {
		t.Fatal(err)
	}
	X := f64(x)
	A := matmul(X, M, H, f64(gate.Float32s()), I, true)
	B := matmul(X, M, H, f64(up.Float32s()), I, true)
	h := make([]float64, M*I)
	for i := range h {
		h[i] = silu(A[i]) * B[i]
	}
	Y := matmul(h, M, I, f64(down.Float32s()), H, true)
	if e := relErr(y3, Y); e > 1e-4 {
		t.Errorf("tiled forward vs float64: %g", e)
	}
	if e := relErr(y3, f64(y1)); e > 1e-5 {
		t.Errorf("tiled vs untiled forward: %g", e)
	}
	gy := rnd(M*H, 1)
	gd3, gd1, gx3, gx1 := nan32(H*I), nan32(H*I), nan32(M*H), nan32(M*H)
	for _, c := range []struct {
		tiles  int64
		gd, gx []float32
	}{{3, gd3, gx3}, {1, gd1, gx1}} {
		if err := mlp.Backward(osftrt.MustWrap(x, M, H), osftrt.MustWrap(gy, M, H), osftrt.MLPGrads{
			GradX: osftrt.MustWrap(c.gx, M, H), GradDown: osftrt.MustWrap(c.gd, H, I)}, c.tiles); err != nil {
			t.Fatal(err)
		}
	}
	if e := relErr(gd3, matmul(transpose(f64(gy), M, H), H, M, h, I, false)); e > 1e-4 {
		t.Errorf("grad_down vs float64: %g", e)
	}
	if e := relErr(gd3, f64(gd1)); e > 1e-5 {
		t.Errorf("tiled vs untiled grad_down: %g", e)
	}
	if e := relErr(gx3, f64(gx1)); e > 1e-5 {
		t.Errorf("tiled vs untiled grad_x: %g", e)
	}
	if n, tt, err := mlp.TileCount(100); err != nil || n < 1 || tt < 1 {
		t.Fatalf("tile count %d %d %v", n, tt, err)
	}
}

func TestBatchedQR(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	shapes := [][2]int{{9, 4}, {6, 6}, {20, 3}}
	var a, q, r []osftrt.Arg
	var as, qs, rs [][]float64
	for _, s := range shapes {
		m, n := s[0], s[1]
		av := f64(rnd(m*n, 1))
		qv, rv := make([]float64, m*n), make([]float64, n*n)
		for i := range qv {
			qv[i] = math.NaN()
		}
		for i := range rv {
			rv[i] = math.NaN()
		}
		as, qs, rs = append(as, av), append(qs, qv), append(rs, rv)
		a = append(a, osftrt.MustWrap(av, int64(m), int64(n)))
		q = append(q, osftrt.MustWrap(qv, int64(m), int64(n)))
		r = append(r, osftrt.MustWrap(rv, int64(n), int64(n)))
	}
	// one fp32 matrix in C memory, factored in place
	cm, _ := osftrt.NewCTensor(osftrt.Float32, 7, 5)
	copy(cm.Float32s(), rnd(35, 1))
	orig := f64(cm.Float32s())
	a, q, r = append(a, cm), append(q, nil), append(r, nil)
	st, err := osftrt.QRBatch(ctx, nil, a, q, r)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if s != osftrt.StatusSuccess {
			t.Fatalf("matrix %d: %v", i, s)
		}
	}
	for k, s := range shapes {
		m, n := s[0], s[1]
		Q, R, A := qs[k], rs[k], as[k]
		QtQ := matmul(transpose(Q, m, n), n, m, Q, n, false)
		QR := matmul(Q, m, n, R, n, false)
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				d := QtQ[i*n+j]
				if i == j {
					d--
				}
				if math.Abs(d) > 1e-12 {
					t.Errorf("matrix %d: Q^T Q - I = %g", k, d)
				}
				if i > j && R[i*n+j] != 0 || i == j && R[i*n+j] < 0 {
					t.Errorf("matrix %d: R[%d,%d] = %g", k, i, j, R[i*n+j])
				}
			}
		}
		for i := range A {
			if math.Abs(QR[i]-A[i]) > 1e-12 {
				t.Errorf("matrix %d: |QR - A| = %g", k, math.Abs(QR[i]-A[i]))
				break
			}
		}
	}
	Q := f64(cm.Float32s())
	QtQ := matmul(transpose(Q, 7, 5), 5, 7, Q, 5, false)
	for i := 0; i < 5; i++ {
		if math.Abs(QtQ[i*5+i]-1) > 1e-5 {
			t.Errorf("fp32 in place: Q^T Q diagonal %g", QtQ[i*5+i])
		}
	}
	if math.Abs(Q[0]-orig[0]) == 0 {
		t.Errorf("in-place matrix unchanged")
	}
	// a rank-deficient matrix fails alone
	bad := make([]float64, 12)
	good := f64(rnd(12, 1))
	st, err = osftrt.QRBatch(ctx, nil, []osftrt.Arg{osftrt.MustWrap(bad, 4, 3), osftrt.MustWrap(good, 4, 3)}, nil, nil)
	if !errors.Is(err, osftrt.ErrNumericalError) || st[0] != osftrt.StatusNumericalError || st[1] != osftrt.StatusSuccess {
		t.Fatalf("rank-deficient: %v %v", st, err)
	}
	// power iteration
	sq := f64(rnd(16, 1))
	qv := f64(rnd(8, 1))
	if _, err := osftrt.QRPowerIteration(ctx, nil, []osftrt.Arg{osftrt.MustWrap(sq, 4, 4)},
		[]osftrt.Arg{osftrt.MustWrap(qv, 4, 2)}, 3); err != nil {
		t.Fatal(err)
	}
}

// QR options reach the library (they travel by value in the call buffer):
// each field changes what the call does or accepts.
func TestQROptionsReachTheLibrary(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	// two equal columns: rank-deficient, refused by default, factored with
	// the rank check off
	dup := []float64{1, 1, 2, 2, 3, 3, 4, 4}
	st, err := osftrt.QRBatch(ctx, nil, []osftrt.Arg{osftrt.MustWrap(append([]float64(nil), dup...), 4, 2)}, nil, nil)
	if !errors.Is(err, osftrt.ErrNumericalError) || st[0] != osftrt.StatusNumericalError {
		t.Fatalf("default options: %v %v", st, err)
	}
	o := osftrt.DefaultQROptions()
	o.RankTolerance = -1
	q := append([]float64(nil), dup...)
	if st, err = osftrt.QRBatch(ctx, &o, []osftrt.Arg{osftrt.MustWrap(q, 4, 2)}, nil, nil); err != nil || st[0] != osftrt.StatusSuccess {
		t.Fatalf("RankTolerance -1: %v %v", st, err)
	}
	for j := 0; j < 2; j++ {
		norm := 0.0
		for i := 0; i < 4; i++ {
			norm += q[2*i+j] * q[2*i+j]
		}
		if math.Abs(norm-1) > 1e-12 {
			t.Errorf("RankTolerance -1: column %d norm^2 %g", j, norm)
		}
	}
	a := []osftrt.Arg{osftrt.MustWrap(f64(rnd(12, 1)), 4, 3)}
	bad := []struct {
		name string
		set  func(*osftrt.QROptions)
		want string
	}{
		{"method", func(o *osftrt.QROptions) { o.Method = 7 }, "method"},
		{"threshold", func(o *osftrt.QROptions) { o.OrthogonalityThreshold = math.NaN() }, "threshold"},
		{"tolerance", func(o *osftrt.QROptions) { o.RankTolerance = math.NaN() }, "rank_tolerance"},
		{"concurrency", func(o *osftrt.QROptions) { o.MaxConcurrency = -2 }, "max_concurrency"},
	}
	for _, c := range bad {
		o := osftrt.DefaultQROptions()
		c.set(&o)
		_, err := osftrt.QRBatch(ctx, &o, a, nil, nil)
		if !errors.Is(err, osftrt.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// CholeskyQR2 on a well-conditioned matrix agrees with Householder
	x := f64(rnd(40, 1))
	h, c2 := append([]float64(nil), x...), append([]float64(nil), x...)
	o = osftrt.DefaultQROptions()
	o.Method = osftrt.QRCholeskyQR2
	o.MaxConcurrency = 1
	if _, err := osftrt.QRBatch(ctx, nil, []osftrt.Arg{osftrt.MustWrap(h, 10, 4)}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := osftrt.QRBatch(ctx, &o, []osftrt.Arg{osftrt.MustWrap(c2, 10, 4)}, nil, nil); err != nil {
		t.Fatal(err)
	}
	for i := range h {
		if math.Abs(h[i]-c2[i]) > 1e-10 {
			t.Fatalf("CholeskyQR2 vs Householder at %d: %g vs %g", i, c2[i], h[i])
		}
	}
}

// Calls on one context from many goroutines are serialized by the binding.
func TestConcurrentCallsOnOneContext(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const M, H, V = 8, 16, 32
	x, w := rnd(M*H, 1), rnd(V*H, 1)
	y := make([]int32, M)
	for i := range y {
		y[i] = int32(rng.Intn(V))
	}
	ce, err := osftrt.NewFLCE(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	ref := make([]float32, 1)
	in := osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H), Targets: osftrt.MustWrap(y, M)}
	if err := ce.Compute(in, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(ref, 1)}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				l := make([]float32, 1)
				if err := ce.Compute(in, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(l, 1)}); err != nil {
					errs <- err
					return
				}
				if l[0] != ref[0] {
					errs <- errors.New("different loss")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Merge, strategies, WriteFactor, Redecompose against the dense weight.
func TestFLinearMergeStrategiesFactors(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const N, K, M = 10, 14, 5
	w := rnd(N*K, 1)
	layer, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(w, N, K), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	merged := nan32(N * K)
	if err := layer.Merge(osftrt.MustWrap(merged, N, K)); err != nil {
		t.Fatal(err)
	}
	if e := relErr(merged, f64(w)); e > 1e-5 {
		t.Errorf("merge vs the decomposed weight: %g", e)
	}
	x := rnd(M*K, 1)
	ys := map[osftrt.Strategy][]float32{}
	for _, s := range []osftrt.Strategy{osftrt.StrategyFactorized, osftrt.StrategyDense} {
		if err := layer.SetStrategy(s); err != nil {
			t.Fatal(err)
		}
		if got, err := layer.ChooseStrategy(M, osftrt.PassForward); err != nil || got != s {
			t.Fatalf("ChooseStrategy after SetStrategy(%v): %v %v", s, got, err)
		}
		ys[s] = nan32(M * N)
		if err := layer.Forward(osftrt.MustWrap(x, M, K), nil, osftrt.MustWrap(ys[s], M, N)); err != nil {
			t.Fatal(err)
		}
	}
	if e := relErr(ys[osftrt.StrategyDense], f64(ys[osftrt.StrategyFactorized])); e > 1e-5 {
		t.Errorf("dense vs factorized forward: %g", e)
	}
	if err := layer.SetStrategy(osftrt.Strategy(42)); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("unknown strategy: %v", err)
	}
	// doubling S_low changes W by U_low S_low V_low
	sl, shape, err := osftrt.ReadFactor[float32](layer, osftrt.FactorSLow)
	if err != nil || len(shape) != 1 {
		t.Fatal(err)
	}
	if s2, dt, err := layer.FactorShape(osftrt.FactorULow); err != nil || dt != osftrt.Float32 || s2[1] != shape[0] {
		t.Fatalf("FactorShape %v %v %v", s2, dt, err)
	}
	ul, _, _ := osftrt.ReadFactor[float32](layer, osftrt.FactorULow)
	vl, _, _ := osftrt.ReadFactor[float32](layer, osftrt.FactorVLow)
	L := int(shape[0])
	want := f64(merged)
	for i := 0; i < N; i++ {
		for j := 0; j < K; j++ {
			for p := 0; p < L; p++ {
				want[i*K+j] += float64(ul[i*L+p]) * float64(sl[p]) * float64(vl[p*K+j])
			}
		}
	}
	for i := range sl {
		sl[i] *= 2
	}
	if err := osftrt.WriteFactor(layer, osftrt.FactorSLow, sl); err != nil {
		t.Fatal(err)
	}
	if err := osftrt.WriteFactor(layer, osftrt.FactorSLow, sl[:1]); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("short WriteFactor: %v", err)
	}
	if _, _, err := osftrt.ReadFactor[float64](layer, osftrt.FactorSLow); !errors.Is(err, osftrt.ErrDTypeMismatch) {
		t.Fatalf("ReadFactor of the wrong type: %v", err)
	}
	m2 := nan32(N * K)
	if err := layer.Merge(osftrt.MustWrap(m2, N, K)); err != nil {
		t.Fatal(err)
	}
	if e := relErr(m2, want); e > 1e-5 {
		t.Errorf("merge after WriteFactor: %g", e)
	}
	if err := layer.Refresh(); err != nil {
		t.Fatal(err)
	}
	// re-decomposing the current weight keeps it
	if err := layer.Redecompose(nil); err != nil {
		t.Fatal(err)
	}
	m3 := nan32(N * K)
	if err := layer.Merge(osftrt.MustWrap(m3, N, K)); err != nil {
		t.Fatal(err)
	}
	if e := relErr(m3, f64(m2)); e > 1e-5 {
		t.Errorf("merge after Redecompose: %g", e)
	}
}

// An MLP whose up projection is an OSFT layer: the forward equals the dense
// MLP over the layer's merged weight, factor gradients agree between 1 and
// 3 tiles.
func TestMLPWithLayerProjection(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const H, I, M = 12, 20, 9
	layer, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(rnd(I*H, 0.3), I, H), nil)
	if err != nil {
		t.Fatal(err)
	}
	down, _ := osftrt.NewCTensor(osftrt.Float32, H, I)
	copy(down.Float32s(), rnd(H*I, 0.3))
	mlp, err := osftrt.NewMLP(ctx, osftrt.GELUTanh, H, I, osftrt.MLPWeights{
		Up: osftrt.Projection{Layer: layer}, Down: osftrt.Projection{Weight: down}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := layer.Close(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("closing a layer an MLP uses: %v", err)
	}
	upW, _ := osftrt.NewCTensor(osftrt.Float32, I, H)
	if err := layer.Merge(upW); err != nil {
		t.Fatal(err)
	}
	dense, err := osftrt.NewMLP(ctx, osftrt.GELUTanh, H, I, osftrt.MLPWeights{
		Up: osftrt.Projection{Weight: upW}, Down: osftrt.Projection{Weight: down}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := rnd(M*H, 1)
	y, yd := nan32(M*H), nan32(M*H)
	if err := mlp.Forward(osftrt.MustWrap(x, M, H), osftrt.MustWrap(y, M, H), 0); err != nil {
		t.Fatal(err)
	}
	if err := dense.Forward(osftrt.MustWrap(x, M, H), osftrt.MustWrap(yd, M, H), 0); err != nil {
		t.Fatal(err)
	}
	if e := relErr(y, f64(yd)); e > 1e-5 {
		t.Errorf("layer MLP vs dense MLP: %g", e)
	}
	_, _, _, l, _ := layer.Dims()
	gy := rnd(M*H, 1)
	var us, ss, vs [2][]float32
	for k, tiles := range []int64{1, 3} {
		us[k], ss[k], vs[k] = nan32(int(I*l)), nan32(int(l)), nan32(int(l*H))
		if err := mlp.Backward(osftrt.MustWrap(x, M, H), osftrt.MustWrap(gy, M, H), osftrt.MLPGrads{
			UpFactors: &osftrt.FactorGrads{GradULow: osftrt.MustWrap(us[k], I, l), GradSLow: osftrt.MustWrap(ss[k], l),
				GradVLow: osftrt.MustWrap(vs[k], l, H)}}, tiles); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		a, b []float32
	}{{"grad_u_low", us[1], us[0]}, {"grad_s_low", ss[1], ss[0]}, {"grad_v_low", vs[1], vs[0]}} {
		if e := relErr(c.a, f64(c.b)); e > 1e-5 {
			t.Errorf("%s: 3 tiles vs 1: %g", c.name, e)
		}
	}
	for _, h := range []interface{ Close() error }{mlp, dense, layer} {
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A projector over explicit targets (caller-owned factors in C memory).
func TestProjectorTargets(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const N, K = 10, 12
	layer, f := newFactorLayer(t, ctx, N, K)
	defer layer.Close()
	_, _, r, l, _ := layer.Dims()
	comm, err := osftrt.NewSelfComm(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := osftrt.NewProjector(ctx, comm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := comm.Close(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("closing a communicator a projector uses: %v", err)
	}
	gU, _ := osftrt.NewCTensor(osftrt.Float32, N, l)
	gV, _ := osftrt.NewCTensor(osftrt.Float32, l, K)
	copy(gU.Float32s(), rnd(int(N*l), 1))
	copy(gV.Float32s(), rnd(int(l*K), 1))
	idx, err := p.AddTarget(osftrt.ProjectionTarget{UHigh: f.UHigh, GradULow: gU, ULow: f.ULow,
		VHigh: f.VHigh, GradVLow: gV, VLow: f.VLow})
	if err != nil || idx != 0 {
		t.Fatalf("AddTarget %d %v", idx, err)
	}
	if err := p.Prepare(); err != nil {
		t.Fatal(err)
	}
	if err := p.Project(); err != nil {
		t.Fatal(err)
	}
	R, L := int(r), int(l)
	uh, vh := f64(f.UHigh.Float32s()), f64(f.VHigh.Float32s())
	cu := matmul(transpose(uh, N, R), R, N, f64(gU.Float32s()), L, false) // r x l
	cv := matmul(f64(gV.Float32s()), L, K, vh, R, true)                   // l x r
	for _, v := range append(cu, cv...) {
		if math.Abs(v) > 1e-5 {
			t.Fatalf("projected gradient not orthogonal: %g", v)
		}
	}
	// move U_low off the subspace, then project the parameters back
	ul := f.ULow.Float32s()
	for i := range ul {
		ul[i] += 0.01 * float32(uh[i%len(uh)])
	}
	if u, _, err := p.Orthogonality(); err != nil || u < 1e-4 {
		t.Fatalf("orthogonality after the perturbation: %g %v", u, err)
	}
	if err := p.ProjectParams(); err != nil {
		t.Fatal(err)
	}
	if u, v, err := p.Orthogonality(); err != nil || u > 1e-5 || v > 1e-5 {
		t.Fatalf("orthogonality after ProjectParams: %g %g %v", u, v, err)
	}
	g2, _ := osftrt.NewCTensor(osftrt.Float32, N, l)
	if err := p.SetGrads(idx, g2, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.SetGrads(5, g2, nil); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("SetGrads of a missing target: %v", err)
	}
	if err := p.Invalidate(); err != nil {
		t.Fatal(err)
	}
	if info, err := p.Info(); err != nil || info.Targets != 1 || info.CollectivesPerProject != 0 {
		t.Fatalf("info %+v %v", info, err)
	}
	if err := gU.Free(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("Free of a registered gradient: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gU.Free(); err != nil {
		t.Fatal(err)
	}
	if err := comm.Close(); err != nil {
		t.Fatal(err)
	}
}

// With DeviceTargetCheck a bad target gives a NaN loss, and CheckTargets
// reports it once.
func TestFLCEDeviceTargetCheck(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const M, H, V = 4, 8, 12
	x, w := rnd(M*H, 1), rnd(V*H, 1)
	opts := osftrt.DefaultFLCEOptions()
	if opts.DeviceTargetCheck {
		t.Fatal("DeviceTargetCheck on by default")
	}
	opts.DeviceTargetCheck = true
	ce, err := osftrt.NewFLCE(ctx, &opts)
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	if o, err := ce.Options(); err != nil || !o.DeviceTargetCheck {
		t.Fatalf("Options %+v %v", o, err)
	}
	loss := nan32(1)
	run := func(y []int64) error {
		return ce.Compute(osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H),
			Targets: osftrt.MustWrap(y, M)}, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1)})
	}
	if err := run([]int64{0, 1, 2, 3}); err != nil || math.IsNaN(float64(loss[0])) {
		t.Fatalf("good targets: %v %v", loss[0], err)
	}
	if err := ce.CheckTargets(); err != nil {
		t.Fatalf("CheckTargets after good targets: %v", err)
	}
	if err := run([]int64{0, 1, V + 2, 3}); err != nil || !math.IsNaN(float64(loss[0])) {
		t.Fatalf("bad target with the device check: loss %v, %v", loss[0], err)
	}
	if err := ce.CheckTargets(); !errors.Is(err, osftrt.ErrIndexOutOfRange) {
		t.Fatalf("CheckTargets after a bad target: %v", err)
	}
	if err := ce.CheckTargets(); err != nil {
		t.Fatalf("the record was not cleared: %v", err)
	}
}

// An empty batch (no tokens) through Go slices: the mean is defined as 0.
func TestFLCEEmptyBatch(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const H, V = 8, 12
	ce, err := osftrt.NewFLCE(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	loss := nan32(1)
	if err := ce.Compute(osftrt.FLCEInputs{X: osftrt.MustWrap([]float32{}, 0, H),
		Weight: osftrt.MustWrap(rnd(V*H, 1), V, H), Targets: osftrt.MustWrap([]int64{}, 0)},
		osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1)}); err != nil {
		t.Fatal(err)
	}
	if loss[0] != 0 {
		t.Fatalf("loss of no tokens: %v", loss[0])
	}
}

// Every Arithmetic projects fp32 gradients as the float64 reference does
// (fp32 parts take the fp32 update under each), a value outside the enum is
// refused by the library, and Info counts what the last call did.
func TestProjectorArithmetic(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const N, K = 10, 12
	layer, f := newFactorLayer(t, ctx, N, K)
	defer layer.Close()
	_, _, r, l, _ := layer.Dims()
	R, L := int(r), int(l)
	uh, vh := f64(f.UHigh.Float32s()), f64(f.VHigh.Float32s())
	gu0, gv0 := rnd(N*L, 1), rnd(L*K, 1)
	// float64 reference: dU - Uh (Uh^T dU), dV - (dV Vh^T) Vh
	wantU, wantV := f64(gu0), f64(gv0)
	pu := matmul(uh, N, R, matmul(transpose(uh, N, R), R, N, wantU, L, false), L, false)
	pv := matmul(matmul(wantV, L, K, vh, R, true), L, R, vh, K, false)
	for i := range wantU {
		wantU[i] -= pu[i]
	}
	for i := range wantV {
		wantV[i] -= pv[i]
	}
	if o := osftrt.DefaultProjectorOptions(); o.Arithmetic != osftrt.ArithmeticAuto {
		t.Fatalf("default arithmetic %d", o.Arithmetic)
	}
	for _, ar := range []osftrt.Arithmetic{osftrt.ArithmeticAuto, osftrt.ArithmeticExact,
		osftrt.ArithmeticFP32, osftrt.ArithmeticBF16} {
		o := osftrt.DefaultProjectorOptions()
		o.Arithmetic = ar
		p, err := osftrt.NewProjector(ctx, nil, &o)
		if err != nil {
			t.Fatal(err)
		}
		gU, _ := osftrt.NewCTensor(osftrt.Float32, N, l)
		gV, _ := osftrt.NewCTensor(osftrt.Float32, l, K)
		copy(gU.Float32s(), gu0)
		copy(gV.Float32s(), gv0)
		if _, err := p.AddTarget(osftrt.ProjectionTarget{UHigh: f.UHigh, GradULow: gU, ULow: f.ULow,
			VHigh: f.VHigh, GradVLow: gV, VLow: f.VLow}); err != nil {
			t.Fatal(err)
		}
		if info, err := p.Info(); err != nil || info.LastGemms != 0 || info.LastGemmCalls != 0 ||
			info.LastElementwiseCalls != 0 || info.LastCollectives != 0 || info.LastHostWaits != 0 {
			t.Fatalf("arithmetic %d: counters before the first call %+v %v", ar, info, err)
		}
		if err := p.Project(); err != nil {
			t.Fatal(err)
		}
		if e := relErr(gU.Float32s(), wantU); e > 1e-4 {
			t.Errorf("arithmetic %d: projected grad_u_low rel error %g", ar, e)
		}
		if e := relErr(gV.Float32s(), wantV); e > 1e-4 {
			t.Errorf("arithmetic %d: projected grad_v_low rel error %g", ar, e)
		}
		// two parts, each C = U_high^T x (x V_high^T) and the update: 4 GEMMs
		info, err := p.Info()
		if err != nil || info.LastGemms < 4 || info.LastGemmCalls < 1 || info.LastGemmCalls > info.LastGemms ||
			info.LastCollectives != 0 || info.LastHostWaits != 0 {
			t.Errorf("arithmetic %d: counters after Project %+v %v", ar, info, err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		_ = gU.Free()
		_ = gV.Free()
	}
	o := osftrt.DefaultProjectorOptions()
	o.Arithmetic = 9
	if _, err := osftrt.NewProjector(ctx, nil, &o); !errors.Is(err, osftrt.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "arithmetic") {
		t.Fatalf("NewProjector with arithmetic 9: %v", err)
	}
}

// QRCholeskyTF32 on fp32 matrices gives an orthonormal Q with Q R = A to
// fp32 accuracy (the CPU rounds its Gram operands to TF32 as a GPU does).
func TestQRCholeskyTF32(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	const m, n = 40, 8
	a := rnd(m*n, 1)
	q, rr := append([]float32(nil), a...), nan32(n*n)
	o := osftrt.DefaultQROptions()
	o.Method = osftrt.QRCholeskyTF32
	st, err := osftrt.QRBatch(ctx, &o, []osftrt.Arg{osftrt.MustWrap(q, m, n)}, nil,
		[]osftrt.Arg{osftrt.MustWrap(rr, n, n)})
	if err != nil || st[0] != osftrt.StatusSuccess {
		t.Fatalf("QRBatch CholeskyTF32: %v %v", st, err)
	}
	Q, Rm := f64(q), f64(rr)
	qtq := matmul(transpose(Q, m, n), n, m, Q, n, false)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			want := 0.0
			if i == j {
				want = 1
			}
			if math.Abs(qtq[i*n+j]-want) > 1e-5 {
				t.Fatalf("Q^T Q [%d,%d] = %g", i, j, qtq[i*n+j])
			}
			if i > j && Rm[i*n+j] != 0 {
				t.Fatalf("R [%d,%d] = %g below the diagonal", i, j, Rm[i*n+j])
			}
		}
	}
	if e := relErr(a, matmul(Q, m, n, Rm, n, false)); e > 1e-5 {
		t.Fatalf("Q R vs A: rel error %g", e)
	}
}

// lowRank: an m x n matrix B C (B m x k and C k x n random, k < n): of rank
// k in float64 arithmetic, and rank-deficient to working precision once
// rounded to float32 (fp32: its values are rounded here).
func lowRank(m, n, k int, fp32 bool) []float64 {
	b, c := f64(rnd(m*k, 1)), f64(rnd(k*n, 1))
	p := matmul(b, m, k, c, n, false)
	for i := range p {
		if fp32 {
			p[i] = float64(float32(p[i]))
		}
	}
	return p
}

// checkQR: Q (m x n) has orthonormal columns and, with R given, R is upper
// triangular with diag(R) >= 0 and Q R = A, in float64, to tol relative to
// max |A|.
func checkQR(t *testing.T, what string, A, Q, R []float64, m, n int, tol float64) {
	t.Helper()
	qtq := matmul(transpose(Q, m, n), n, m, Q, n, false)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			d := qtq[i*n+j]
			if i == j {
				d--
			}
			if math.IsNaN(d) || math.Abs(d) > tol {
				t.Errorf("%s: (Q^T Q - I)[%d,%d] = %g", what, i, j, d)
				return
			}
			if R != nil && (i > j && R[i*n+j] != 0 || i == j && !(R[i*n+j] >= 0)) {
				t.Errorf("%s: R[%d,%d] = %g", what, i, j, R[i*n+j])
				return
			}
		}
	}
	if R == nil {
		return
	}
	qr, big, worst := matmul(Q, m, n, R, n, false), 0.0, 0.0
	for i := range A {
		big = math.Max(big, math.Abs(A[i]))
		worst = math.Max(worst, math.Abs(qr[i]-A[i]))
	}
	if !(worst <= tol*big) {
		t.Errorf("%s: max |Q R - A| = %g (max |A| %g)", what, worst, big)
	}
}

// QROptions.RankDeficient: a rank-deficient matrix among full-rank ones (a
// batch of fp64 and fp32, every method) is factored (Q orthonormal, Q R = A
// in float64), reported for it alone, and not a failure; a NaN matrix
// beside it still fails; without the option it fails alone as before, its
// outputs untouched; power iteration on a singular factor likewise; a slice
// of the wrong length is refused before anything is written.
func TestQRRankDeficient(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	type mat struct {
		m, n, rank int
		fp32       bool
	}
	list := []mat{{12, 5, 0, false}, {10, 6, 2, false}, {9, 4, 0, true}, {8, 8, 3, true}, {7, 3, 0, false}}
	wantFlags := []bool{false, true, false, true, false}
	for _, method := range []osftrt.QRMethod{osftrt.QRHouseholder, osftrt.QRCholeskyQR2, osftrt.QRCholeskyTF32} {
		for _, factor := range []bool{true, false} {
			var a, q, r []osftrt.Arg
			var as []([]float64)
			var q64, r64 [][]float64
			var q32, r32 [][]float32
			for _, s := range list {
				var av []float64
				if s.rank > 0 {
					av = lowRank(s.m, s.n, s.rank, s.fp32)
				} else {
					av = f64(rnd(s.m*s.n, 1))
				}
				as = append(as, av)
				if s.fp32 {
					a32 := make([]float32, len(av))
					for i, x := range av {
						a32[i] = float32(x)
					}
					qv, rv := nan32(s.m*s.n), nan32(s.n*s.n)
					q32, r32 = append(q32, qv), append(r32, rv)
					q64, r64 = append(q64, nil), append(r64, nil)
					a = append(a, osftrt.MustWrap(a32, int64(s.m), int64(s.n)))
					q = append(q, osftrt.MustWrap(qv, int64(s.m), int64(s.n)))
					r = append(r, osftrt.MustWrap(rv, int64(s.n), int64(s.n)))
				} else {
					qv, rv := f64(nan32(s.m*s.n)), f64(nan32(s.n*s.n))
					q64, r64 = append(q64, qv), append(r64, rv)
					q32, r32 = append(q32, nil), append(r32, nil)
					a = append(a, osftrt.MustWrap(av, int64(s.m), int64(s.n)))
					q = append(q, osftrt.MustWrap(qv, int64(s.m), int64(s.n)))
					r = append(r, osftrt.MustWrap(rv, int64(s.n), int64(s.n)))
				}
			}
			o := osftrt.DefaultQROptions()
			o.Method = method
			if factor {
				o.RankDeficient = make([]bool, len(list))
				for i := range o.RankDeficient {
					o.RankDeficient[i] = !wantFlags[i] // poisoned: every entry must be written
				}
			}
			name := func(k int) string { return fmt.Sprintf("method %d factor %v matrix %d", method, factor, k) }
			st, err := osftrt.QRBatch(ctx, &o, a, q, r)
			if factor {
				if err != nil {
					t.Fatalf("%s: %v %v", name(-1), st, err)
				}
				for k := range list {
					if st[k] != osftrt.StatusSuccess || o.RankDeficient[k] != wantFlags[k] {
						t.Errorf("%s: status %v, flag %v", name(k), st[k], o.RankDeficient[k])
					}
				}
			} else {
				if !errors.Is(err, osftrt.ErrNumericalError) {
					t.Fatalf("%s: want ErrNumericalError, got %v %v", name(-1), st, err)
				}
				for k := range list {
					want := osftrt.StatusSuccess
					if wantFlags[k] {
						want = osftrt.StatusNumericalError
					}
					if st[k] != want {
						t.Errorf("%s: status %v, want %v", name(k), st[k], want)
					}
				}
			}
			for k, s := range list {
				if !factor && wantFlags[k] { // failed: outputs untouched (still NaN)
					untouched := true
					if s.fp32 {
						for _, v := range append(append([]float32(nil), q32[k]...), r32[k]...) {
							untouched = untouched && math.IsNaN(float64(v))
						}
					} else {
						for _, v := range append(append([]float64(nil), q64[k]...), r64[k]...) {
							untouched = untouched && math.IsNaN(v)
						}
					}
					if !untouched {
						t.Errorf("%s: a failed matrix's outputs were written", name(k))
					}
					continue
				}
				tol := 1e-12
				Q, R := q64[k], r64[k]
				if s.fp32 {
					tol = 2e-5
					Q, R = f64(q32[k]), f64(r32[k])
				}
				checkQR(t, name(k), as[k], Q, R, s.m, s.n, tol)
			}
		}
	}

	// NaN beside a rank-deficient matrix: the NaN one still fails (flag
	// false), the rank-deficient one is factored and flagged.
	nanA, sing := f64(nan32(12)), lowRank(4, 3, 1, false)
	qn, qs := f64(nan32(12)), f64(nan32(12))
	o := osftrt.DefaultQROptions()
	o.RankDeficient = []bool{true, false}
	st, err := osftrt.QRBatch(ctx, &o, []osftrt.Arg{osftrt.MustWrap(nanA, 4, 3), osftrt.MustWrap(sing, 4, 3)},
		[]osftrt.Arg{osftrt.MustWrap(qn, 4, 3), osftrt.MustWrap(qs, 4, 3)}, nil)
	if !errors.Is(err, osftrt.ErrNumericalError) || st[0] != osftrt.StatusNumericalError ||
		st[1] != osftrt.StatusSuccess || o.RankDeficient[0] || !o.RankDeficient[1] {
		t.Fatalf("NaN beside rank-deficient: %v %v %v", st, o.RankDeficient, err)
	}
	checkQR(t, "beside NaN", sing, qs, nil, 4, 3, 1e-12)

	// Power iteration on a singular factor (rank 2, 6 x 6; Q 6 x 3): the
	// product A Q is rank-deficient. Without the option the pair fails with
	// its Q unchanged; with it the new Q is orthonormal and spans A Q_0
	// (Q Q^T (A Q_0) = A Q_0), and the pair is flagged; a full-rank pair
	// beside it is not.
	const m, n = 6, 3
	sq, full := lowRank(m, m, 2, false), f64(rnd(m*m, 1))
	q0, qf0 := f64(rnd(m*n, 1)), f64(rnd(m*n, 1))
	for _, factor := range []bool{false, true} {
		qv, qf := append([]float64(nil), q0...), append([]float64(nil), qf0...)
		o := osftrt.DefaultQROptions()
		if factor {
			o.RankDeficient = make([]bool, 2)
		}
		st, err := osftrt.QRPowerIteration(ctx, &o, []osftrt.Arg{osftrt.MustWrap(sq, m, m), osftrt.MustWrap(full, m, m)},
			[]osftrt.Arg{osftrt.MustWrap(qv, m, n), osftrt.MustWrap(qf, m, n)}, 1)
		if !factor {
			if !errors.Is(err, osftrt.ErrNumericalError) || st[0] != osftrt.StatusNumericalError || st[1] != osftrt.StatusSuccess {
				t.Fatalf("power iteration without the option: %v %v", st, err)
			}
			for i := range qv {
				if qv[i] != q0[i] {
					t.Fatalf("power iteration: a failed pair's Q was written")
				}
			}
			continue
		}
		if err != nil || st[0] != osftrt.StatusSuccess || st[1] != osftrt.StatusSuccess ||
			!o.RankDeficient[0] || o.RankDeficient[1] {
			t.Fatalf("power iteration with the option: %v %v %v", st, o.RankDeficient, err)
		}
		for p, c := range []struct{ A, Q0, Q []float64 }{{sq, q0, qv}, {full, qf0, qf}} {
			checkQR(t, fmt.Sprintf("power iteration pair %d", p), nil, c.Q, nil, m, n, 1e-12)
			aq := matmul(c.A, m, m, c.Q0, n, false)
			proj := matmul(c.Q, m, n, matmul(transpose(c.Q, m, n), n, m, aq, n, false), n, false)
			worst, big := 0.0, 0.0
			for i := range aq {
				worst, big = math.Max(worst, math.Abs(proj[i]-aq[i])), math.Max(big, math.Abs(aq[i]))
			}
			if !(worst <= 1e-12*big) {
				t.Errorf("power iteration pair %d: |Q Q^T A Q0 - A Q0| = %g (max %g)", p, worst, big)
			}
		}
	}

	// A RankDeficient slice of the wrong length: refused, nothing written.
	qv := f64(nan32(12))
	o = osftrt.DefaultQROptions()
	o.RankDeficient = []bool{true, true}
	if _, err := osftrt.QRBatch(ctx, &o, []osftrt.Arg{osftrt.MustWrap(f64(rnd(12, 1)), 4, 3)},
		[]osftrt.Arg{osftrt.MustWrap(qv, 4, 3)}, nil); !errors.Is(err, osftrt.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "RankDeficient") {
		t.Fatalf("wrong length: %v", err)
	}
	if !math.IsNaN(qv[0]) || !o.RankDeficient[0] || !o.RankDeficient[1] {
		t.Fatalf("wrong length: something was written")
	}
}
