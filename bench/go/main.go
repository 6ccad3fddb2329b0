// Command bench measures what the Go binding adds per call over the same
// call made from C: a tiny fused linear cross-entropy call and osft_qr_batch
// on small matrices. The C baseline loops inside C (no cgo crossing per
// call); the Go side calls the public osftrt API in a Go loop. Each figure
// is the median of several rounds of many calls, rounds of C and Go
// interleaved.
//
//	go run . [-o ../results/go_overhead_cpu.md] [-rounds 15] [-calls 20000]
package main

/*
#cgo pkg-config: osftrt
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <osftrt/osftrt.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static DLTensor mk(void *data, int ndim, int64_t *shape, uint8_t code, uint8_t bits) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

// ns per osft_flce_compute call (loss + grad_x), averaged over `calls`.
static double c_flce(osft_flce_t ce, float *x, float *w, int64_t *y, float *loss, float *gx,
                     int64_t M, int64_t H, int64_t V, int calls) {
  int64_t sx[2] = {M, H}, sw[2] = {V, H}, sy[1] = {M}, sl[1] = {1};
  DLTensor tx = mk(x, 2, sx, kDLFloat, 32), tw = mk(w, 2, sw, kDLFloat, 32);
  DLTensor ty = mk(y, 1, sy, kDLInt, 64), tl = mk(loss, 1, sl, kDLFloat, 32);
  DLTensor tg = mk(gx, 2, sx, kDLFloat, 32);
  osft_flce_inputs_t in;
  osft_flce_outputs_t out;
  OSFT_FLCE_INPUTS_INIT(&in);
  OSFT_FLCE_OUTPUTS_INIT(&out);
  in.x = &tx; in.weight = &tw; in.targets = &ty;
  out.loss = &tl; out.grad_x = &tg;
  double t0 = now_ns();
  for (int i = 0; i < calls; ++i)
    if (osft_flce_compute(ce, &in, &out) != OSFT_STATUS_SUCCESS) return -1;
  return (now_ns() - t0) / calls;
}

// ns per osft_qr_batch call over n m x k fp64 matrices (Q and R out).
static double c_qr(osft_context_t ctx, int n, int64_t m, int64_t k, double *a, double *q, double *r,
                   int calls) {
  int64_t sa[2] = {m, k}, sr[2] = {k, k};
  DLTensor ta[16], tq[16], tr[16];
  const DLTensor *pa[16];
  DLTensor *pq[16], *pr[16];
  osft_status_t st[16];
  osft_qr_options_t o;
  OSFT_QR_OPTIONS_INIT(&o);
  o.max_concurrency = 1;
  for (int i = 0; i < n; ++i) {
    ta[i] = mk(a + i * m * k, 2, sa, kDLFloat, 64);
    tq[i] = mk(q + i * m * k, 2, sa, kDLFloat, 64);
    tr[i] = mk(r + i * k * k, 2, sr, kDLFloat, 64);
    pa[i] = &ta[i]; pq[i] = &tq[i]; pr[i] = &tr[i];
  }
  double t0 = now_ns();
  for (int i = 0; i < calls; ++i)
    if (osft_qr_batch(ctx, &o, (size_t)n, pa, pq, pr, st) != OSFT_STATUS_SUCCESS) return -1;
  return (now_ns() - t0) / calls;
}
*/
import "C"

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"time"
	"unsafe"

	"libosftrt/osftrt"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func minimum(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		if x < m {
			m = x
		}
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, ln := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(ln, "model name") {
			return strings.TrimSpace(strings.SplitN(ln, ":", 2)[1])
		}
	}
	return "unknown"
}

func main() {
	out := flag.String("o", "", "write the results as Markdown to this file")
	rounds := flag.Int("rounds", 301, "rounds per figure (the median is reported)")
	calls := flag.Int("calls", 200, "calls per round and kind")
	flag.Parse()
	runtime.LockOSThread() // keep the timing goroutine on one thread
	r := rand.New(rand.NewSource(1))
	ctx, err := osftrt.NewContext(nil)
	must(err)
	defer ctx.Close()

	// --- tiny FLCE: M=4 tokens, H=16, V=32; loss and grad_x
	const M, H, V = 4, 16, 32
	// C memory for the C loop (cgo forbids handing C Go memory to keep).
	cx := (*[M * H]float32)(C.malloc(C.size_t(4 * M * H)))
	cw := (*[V * H]float32)(C.malloc(C.size_t(4 * V * H)))
	cy := (*[M]int64)(C.malloc(C.size_t(8 * M)))
	cl := (*[1]float32)(C.malloc(4))
	cg := (*[M * H]float32)(C.malloc(C.size_t(4 * M * H)))
	x, w, y := make([]float32, M*H), make([]float32, V*H), make([]int64, M)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	for i := range y {
		y[i] = int64(r.Intn(V))
	}
	copy(cx[:], x)
	copy(cw[:], w)
	copy(cy[:], y)
	ce, err := osftrt.NewFLCE(ctx, nil)
	must(err)
	defer ce.Close()
	cePtr := ce.Raw()
	loss, gx := make([]float32, 1), make([]float32, M*H)
	tx, tw, ty := osftrt.MustWrap(x, M, H), osftrt.MustWrap(w, V, H), osftrt.MustWrap(y, M)
	tl, tg := osftrt.MustWrap(loss, 1), osftrt.MustWrap(gx, M, H)

	// --- small QR: 4 fp64 matrices 16 x 8, Q and R
	const NQ, QM, QK = 4, 16, 8
	ca := (*[NQ * QM * QK]float64)(C.malloc(C.size_t(8 * NQ * QM * QK)))
	cq := (*[NQ * QM * QK]float64)(C.malloc(C.size_t(8 * NQ * QM * QK)))
	cr := (*[NQ * QK * QK]float64)(C.malloc(C.size_t(8 * NQ * QK * QK)))
	for i := range ca {
		ca[i] = r.NormFloat64()
	}
	qopts := osftrt.DefaultQROptions()
	qopts.MaxConcurrency = 1
	var ga, gq, gr []osftrt.Arg // Go slices (staged through C memory per call)
	var ka, kq, kr []osftrt.Arg // CTensors
	for i := 0; i < NQ; i++ {
		av := append([]float64(nil), ca[i*QM*QK:(i+1)*QM*QK]...)
		ga = append(ga, osftrt.MustWrap(av, QM, QK))
		gq = append(gq, osftrt.MustWrap(make([]float64, QM*QK), QM, QK))
		gr = append(gr, osftrt.MustWrap(make([]float64, QK*QK), QK, QK))
		at, _ := osftrt.NewCTensor(osftrt.Float64, QM, QK)
		must(osftrt.CopyFrom(at, av))
		qt, _ := osftrt.NewCTensor(osftrt.Float64, QM, QK)
		rt, _ := osftrt.NewCTensor(osftrt.Float64, QK, QK)
		ka, kq, kr = append(ka, at), append(kq, qt), append(kr, rt)
	}
	qcalls := *calls / 2

	type fig struct{ c, goPre, goWrap []float64 }
	var fl, qr fig
	meas := []func(){
		func() { // C baseline: FLCE
			v := float64(C.c_flce((C.osft_flce_t)(unsafe.Pointer(cePtr)), (*C.float)(unsafe.Pointer(&cx[0])), (*C.float)(unsafe.Pointer(&cw[0])), (*C.int64_t)(unsafe.Pointer(&cy[0])),
				(*C.float)(unsafe.Pointer(&cl[0])), (*C.float)(unsafe.Pointer(&cg[0])), M, H, V, C.int(*calls)))
			if v < 0 {
				must(fmt.Errorf("C flce loop failed"))
			}
			fl.c = append(fl.c, v)
		},
		func() { // C baseline: QR
			v := float64(C.c_qr((C.osft_context_t)(unsafe.Pointer(ctx.Raw())), NQ, QM, QK, (*C.double)(unsafe.Pointer(&ca[0])), (*C.double)(unsafe.Pointer(&cq[0])), (*C.double)(unsafe.Pointer(&cr[0])), C.int(qcalls)))
			if v < 0 {
				must(fmt.Errorf("C qr loop failed"))
			}
			qr.c = append(qr.c, v)
		},
		func() { // Go: tensors wrapped once and reused
			t0 := time.Now()
			for i := 0; i < *calls; i++ {
				must(ce.Compute(osftrt.FLCEInputs{X: tx, Weight: tw, Targets: ty}, osftrt.FLCEOutputs{Loss: tl, GradX: tg}))
			}
			fl.goPre = append(fl.goPre, float64(time.Since(t0).Nanoseconds())/float64(*calls))
		},
		func() { // Go: slices wrapped in every call
			t0 := time.Now()
			for i := 0; i < *calls; i++ {
				must(ce.Compute(osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H),
					Targets: osftrt.MustWrap(y, M)}, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1),
					GradX: osftrt.MustWrap(gx, M, H)}))
			}
			fl.goWrap = append(fl.goWrap, float64(time.Since(t0).Nanoseconds())/float64(*calls))
		},
		func() { // Go QR: CTensors (no copy)
			t0 := time.Now()
			for i := 0; i < qcalls; i++ {
				_, err := osftrt.QRBatch(ctx, &qopts, ka, kq, kr)
				must(err)
			}
			qr.goPre = append(qr.goPre, float64(time.Since(t0).Nanoseconds())/float64(qcalls))
		},
		func() { // Go QR: Go slices (staged)
			t0 := time.Now()
			for i := 0; i < qcalls; i++ {
				_, err := osftrt.QRBatch(ctx, &qopts, ga, gq, gr)
				must(err)
			}
			qr.goWrap = append(qr.goWrap, float64(time.Since(t0).Nanoseconds())/float64(qcalls))
		},
	}
	for _, m := range meas { // warm-up
		m()
	}
	fl, qr = fig{}, fig{}
	for round := 0; round < *rounds; round++ {
		for _, k := range r.Perm(len(meas)) { // a new order every round
			meas[k]()
		}
	}
	goVer, _ := exec.Command("go", "version").Output()
	var b strings.Builder
	fmt.Fprintf(&b, "# Go binding: per-call overhead against C (CPU)\n\n")
	fmt.Fprintf(&b, "Measured %s on %s (%d cores visible), %s, libosftrt %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), cpuModel(), runtime.NumCPU(),
		strings.TrimSpace(string(goVer)), osftrt.VersionString())
	fmt.Fprintf(&b, "Command: `source .ci/lib_prefix.sh && cd bench/go && OPENBLAS_NUM_THREADS=1 go run . -o ../results/go_overhead_cpu.md`\n")
	fmt.Fprintf(&b, "(%d rounds, each the mean of %d FLCE calls / %d QR calls; the C and Go columns are the fastest\n", *rounds, *calls, qcalls)
	fmt.Fprintf(&b, "round, which is the least disturbed by other processes on a shared machine; C loops run inside C,\n")
	fmt.Fprintf(&b, "Go loops call the public `osftrt` API; the six measurements run in a new random order every round;\n")
	fmt.Fprintf(&b, "OPENBLAS_NUM_THREADS=%s). Goal: <= 2 us added per call.\n\n", os.Getenv("OPENBLAS_NUM_THREADS"))
	fmt.Fprintf(&b, "| Call | C (us/call) | Go (us/call) | added by Go (us), fastest rounds | added by Go (us), median rounds |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|\n")
	row := func(name string, c, g []float64) {
		lc, lg := minimum(c)/1e3, minimum(g)/1e3
		mc, mg := median(c)/1e3, median(g)/1e3
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.3f | %.3f |\n", name, lc, lg, lg-lc, mg-mc)
	}
	row("tiny FLCE (M=4, H=16, V=32; loss + grad_x), tensors wrapped once", fl.c, fl.goPre)
	row("tiny FLCE, Go slices wrapped in every call (5 `Wrap`s)", fl.c, fl.goWrap)
	row("`osft_qr_batch`, 4 fp64 16x8 matrices (Q, R), CTensors", qr.c, qr.goPre)
	row("`osft_qr_batch`, same, Go slices (staged in a reused Go buffer)", qr.c, qr.goWrap)
	fmt.Fprintf(&b, "\nWhat the Go side adds: one cgo call into the SWIG-generated entry (`osftgo_call`, or `osftgo_qr`\n")
	fmt.Fprintf(&b, "for QR lists), the context's mutex, descriptor filling in a reused Go buffer, and for QR the\n")
	fmt.Fprintf(&b, "descriptor list (reused per context; the options travel by value in the call buffer) plus the\n")
	fmt.Fprintf(&b, "copies of Go-slice matrices into the context's pointer-free staging buffer and back.\n")
	fmt.Print(b.String())
	if *out != "" {
		must(os.WriteFile(*out, []byte(b.String()), 0o644))
	}
}
