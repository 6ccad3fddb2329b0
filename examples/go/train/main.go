// Command train is a 20-step OSFT fine-tuning loop in Go: an OSFT layer
// (caller-owned factors in C memory) feeding a fused linear cross-entropy
// head, with the gradient projected out of the frozen subspace before every
// step and the parameters projected after it. It checks that the loss falls
// and that the trainable factors stay orthogonal to the frozen ones
// (<= 1e-5), and exits 1 otherwise.
//
//	go run ./train            (from examples/go; PKG_CONFIG_PATH and
//	                           LD_LIBRARY_PATH must find libosftrt)
package main

import (
	"fmt"
	"math"
	"math/rand"
	"os"

	"libosftrt/osftrt"
)

const (
	M     = 64 // tokens
	K     = 48 // layer input features
	N     = 32 // layer output features (= the head's hidden size)
	V     = 24 // classes
	steps = 20
	lr    = 0.5
)

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "train:", err)
		os.Exit(1)
	}
}

func randn(r *rand.Rand, n int, s float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * s)
	}
	return v
}

func main() {
	check(osftrt.CheckVersion())
	r := rand.New(rand.NewSource(7))
	ctx, err := osftrt.NewContext(nil)
	check(err)
	defer ctx.Close()

	// Pretrained weight -> SVD -> six factors copied into C memory, which
	// the layer (and the projector, through it) keeps using.
	pre, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(randn(r, N*K, 1/math.Sqrt(K)), N, K), nil)
	check(err)
	var f osftrt.FLinearFactors
	for _, p := range []struct {
		which osftrt.Factor
		dst   **osftrt.CTensor
	}{{osftrt.FactorUHigh, &f.UHigh}, {osftrt.FactorSHigh, &f.SHigh}, {osftrt.FactorVHigh, &f.VHigh},
		{osftrt.FactorULow, &f.ULow}, {osftrt.FactorSLow, &f.SLow}, {osftrt.FactorVLow, &f.VLow}} {
		v, shape, err := osftrt.ReadFactor[float32](pre, p.which)
		check(err)
		ct, err := osftrt.NewCTensor(osftrt.Float32, shape...)
		check(err)
		check(osftrt.CopyFrom(ct, v))
		*p.dst = ct
	}
	check(pre.Close())
	layer, err := osftrt.NewFLinearFromFactors(ctx, f, nil)
	check(err)
	defer layer.Close()
	_, _, _, l, err := layer.Dims()
	check(err)

	// Gradients of the trainable factors: C memory, registered with the projector.
	gU, err := osftrt.NewCTensor(osftrt.Float32, N, l)
	check(err)
	gS, err := osftrt.NewCTensor(osftrt.Float32, l)
	check(err)
	gV, err := osftrt.NewCTensor(osftrt.Float32, l, K)
	check(err)
	proj, err := osftrt.NewProjector(ctx, nil, nil)
	check(err)
	defer proj.Close()
	_, err = proj.AddLayer(layer, gU, gV)
	check(err)

	ce, err := osftrt.NewFLCE(ctx, nil)
	check(err)
	defer ce.Close()

	// Data: a fixed batch whose labels come from a random teacher.
	x := randn(r, M*K, 1)
	head := randn(r, V*N, 1/math.Sqrt(N))
	teacher := randn(r, V*K, 1)
	y := make([]int64, M)
	for i := range y {
		best := math.Inf(-1)
		for c := 0; c < V; c++ {
			s := 0.0
			for k := 0; k < K; k++ {
				s += float64(x[i*K+k] * teacher[c*K+k])
			}
			if s > best {
				best, y[i] = s, int64(c)
			}
		}
	}

	h := make([]float32, M*N)  // layer output
	gh := make([]float32, M*N) // dL/dh from the loss
	loss := make([]float32, 1)
	var first, last, worstOrth float64
	for step := 0; step < steps; step++ {
		check(layer.Forward(osftrt.MustWrap(x, M, K), nil, osftrt.MustWrap(h, M, N)))
		check(ce.Compute(osftrt.FLCEInputs{X: osftrt.MustWrap(h, M, N), Weight: osftrt.MustWrap(head, V, N),
			Targets: osftrt.MustWrap(y, M)}, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1),
			GradX: osftrt.MustWrap(gh, M, N)}))
		check(layer.Backward(osftrt.MustWrap(x, M, K), osftrt.MustWrap(gh, M, N),
			osftrt.FLinearGrads{GradULow: gU, GradSLow: gS, GradVLow: gV}))
		check(proj.Project()) // gradients out of the frozen subspace
		for _, p := range []struct{ w, g *osftrt.CTensor }{{f.ULow, gU}, {f.SLow, gS}, {f.VLow, gV}} {
			w, g := p.w.Float32s(), p.g.Float32s()
			for i := range w {
				w[i] -= lr * g[i]
			}
		}
		check(proj.ProjectParams()) // keep Adam-like drift out as well
		ou, ov, err := proj.Orthogonality()
		check(err)
		worstOrth = math.Max(worstOrth, math.Max(ou, ov))
		if step == 0 {
			first = float64(loss[0])
		}
		last = float64(loss[0])
		fmt.Printf("step %2d  loss %.5f  orthogonality U %.2e V %.2e\n", step, loss[0], ou, ov)
	}
	fmt.Printf("loss %.5f -> %.5f; worst orthogonality %.2e\n", first, last, worstOrth)
	if !(last < 0.95*first) || worstOrth > 1e-5 {
		fmt.Fprintln(os.Stderr, "train: FAIL (the loss must fall by 5% and orthogonality stay <= 1e-5)")
		os.Exit(1)
	}
	fmt.Println("train: OK")
}
