package osftrt_test

import (
	"errors"
	"fmt"

	"libosftrt/osftrt"
)

// The fused linear cross-entropy call. With a zero weight every logit is 0,
// so the loss is log(V) for any hidden states.
func ExampleFLCE_Compute() {
	const M, H, V = 3, 4, 32
	ctx, err := osftrt.NewContext(nil)
	if err != nil {
		panic(err)
	}
	defer ctx.Close()
	ce, err := osftrt.NewFLCE(ctx, nil) // the defaults of osft_flce_options_init
	if err != nil {
		panic(err)
	}
	defer ce.Close()
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12} // M x H, row-major
	w := make([]float32, V*H)                             // V x H
	y := []int64{0, 7, 31}                                // class ids
	loss, gx := make([]float32, 1), make([]float32, M*H)
	err = ce.Compute(
		osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H), Targets: osftrt.MustWrap(y, M)},
		osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1), GradX: osftrt.MustWrap(gx, M, H)})
	fmt.Printf("loss %.4f, err %v\n", loss[0], err)

	y[2] = V // out of range: an error, and nothing is written
	err = ce.Compute(
		osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H), Targets: osftrt.MustWrap(y, M)},
		osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1)})
	fmt.Println(errors.Is(err, osftrt.ErrIndexOutOfRange), loss[0] > 3.46)
	// Output:
	// loss 3.4657, err <nil>
	// true true
}
