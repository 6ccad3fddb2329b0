package osftrt_test

import (
	"testing"

	"libosftrt/osftrt"
)

// BenchmarkFLCETiny: one tiny FLCE call through the Go API (see
// bench/go for the comparison with the same call from C).
func BenchmarkFLCETiny(b *testing.B) {
	ctx := newCtx(b)
	defer ctx.Close()
	const M, H, V = 4, 16, 32
	x, w := rnd(M*H, 1), rnd(V*H, 1)
	y := []int64{1, 5, 7, 30}
	ce, err := osftrt.NewFLCE(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ce.Close()
	in := osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H), Targets: osftrt.MustWrap(y, M)}
	out := osftrt.FLCEOutputs{Loss: osftrt.MustWrap(make([]float32, 1), 1), GradX: osftrt.MustWrap(make([]float32, M*H), M, H)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := ce.Compute(in, out); err != nil {
			b.Fatal(err)
		}
	}
}
