package osftrt_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"libosftrt/osftrt"
)

var repo = filepath.Join("..", "..", "..")

// includeDir is the public headers' directory (OSFTRT_INCLUDE_DIR overrides
// it: .ci/stage_go.sh points it at a copy with an extra function to prove
// that the completeness test fails then).
func includeDir() string {
	if d := os.Getenv("OSFTRT_INCLUDE_DIR"); d != "" {
		return d
	}
	return filepath.Join(repo, "include")
}

// A test fails when a public header declares a function that the Go
// package does not expose (CFunctions), or that the SWIG layer lacks.
func TestEveryHeaderFunctionIsExposed(t *testing.T) {
	headers, err := filepath.Glob(filepath.Join(includeDir(), "osftrt", "*.h"))
	if err != nil || len(headers) == 0 {
		t.Fatalf("no headers found under %s: %v", includeDir(), err)
	}
	decl := regexp.MustCompile(`(?s)OSFT_API\s[^;{]*?\b(osft_[a-z0-9_]+)\s*\(`)
	var names []string
	dup := map[string]bool{}
	for _, h := range headers {
		src, err := os.ReadFile(h)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			if !dup[m[1]] {
				names = append(names, m[1])
			}
			dup[m[1]] = true
		}
	}
	sort.Strings(names)
	if len(names) < 80 {
		t.Fatalf("only %d functions found in the headers", len(names))
	}
	swig, err := os.ReadFile(filepath.Join("internal", "capi", "capi.go"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
		v, ok := osftrt.CFunctions[n]
		_, skipped := osftrt.NotExposed[n]
		switch {
		case ok && skipped:
			t.Errorf("%s is both exposed and listed as not exposed", n)
		case ok:
			if v == nil || reflect.ValueOf(v).Kind() != reflect.Func {
				t.Errorf("%s: CFunctions entry is not a function", n)
			}
		case !skipped:
			t.Errorf("the header declares %s, which the Go package does not expose (add it to CFunctions)", n)
		}
		if !regexp.MustCompile(`(?m)^func ` + strings_Title(n) + `\(`).Match(swig) {
			t.Errorf("the SWIG layer has no wrapper for %s: regenerate internal/capi", n)
		}
	}
	for n := range osftrt.CFunctions {
		if !seen[n] {
			t.Errorf("CFunctions names %s, which no header declares", n)
		}
	}
	t.Logf("%d header functions, %d exposed, %d not exposed", len(names), len(osftrt.CFunctions), len(osftrt.NotExposed))
}

// handWritten is the Go package's own source (not the tests) and the C of
// its SWIG additions and callbacks: where a header's enumerator or struct
// field must appear to be reachable from Go.
func handWritten(t *testing.T) (goSrc, cSrc string) {
	t.Helper()
	files, _ := filepath.Glob("*.go")
	extra := []string{filepath.Join("..", "swig", "osftrt_go.i"),
		filepath.Join("internal", "capi", "callbacks.go"), filepath.Join("internal", "capi", "callbacks.c")}
	for _, f := range append(files, extra...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".go") && !strings.Contains(f, "internal") {
			goSrc += string(b)
		} else {
			cSrc += string(b)
		}
	}
	return goSrc, cSrc
}

// headerText is every public header without its comments.
func headerText(t *testing.T) string {
	t.Helper()
	headers, err := filepath.Glob(filepath.Join(includeDir(), "osftrt", "*.h"))
	if err != nil || len(headers) == 0 {
		t.Fatalf("no headers found under %s: %v", includeDir(), err)
	}
	comment := regexp.MustCompile(`(?s)/\*.*?\*/`)
	var b strings.Builder
	for _, h := range headers {
		src, err := os.ReadFile(h)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(comment.ReplaceAllString(string(src), ""))
	}
	return b.String()
}

// Every enumerator of the headers (statuses: TestStatusCodes) has a Go
// value in the package, so a header that gains one fails here until the Go
// API can pass it.
func TestEveryHeaderEnumeratorIsExposed(t *testing.T) {
	goSrc, _ := handWritten(t)
	n := 0
	for _, m := range regexp.MustCompile(`\b(OSFT_[A-Z0-9_]+)\s*=\s*-?\d`).FindAllStringSubmatch(headerText(t), -1) {
		if strings.HasPrefix(m[1], "OSFT_STATUS_") {
			continue
		}
		n++
		if !strings.Contains(goSrc, "capi."+m[1]) {
			t.Errorf("the header's enumerator %s has no Go value (use capi.%s in the package)", m[1], m[1])
		}
	}
	if n < 50 {
		t.Fatalf("only %d enumerators found in the headers", n)
	}
}

// fieldsNotExposed: struct fields of the headers without a Go API, and why.
var fieldsNotExposed = map[string]string{
	"osft_nccl_unique_id_t.internal":   "opaque bytes, copied whole (NCCLUniqueID)",
	"osft_context_options_t.allocator": "see NotExposed[osft_allocator_init]",
	"osft_allocator_t.host_alloc":      "see NotExposed[osft_allocator_init]",
	"osft_allocator_t.host_free":       "see NotExposed[osft_allocator_init]",
	"osft_allocator_t.device_alloc":    "see NotExposed[osft_allocator_init]",
	"osft_allocator_t.device_free":     "see NotExposed[osft_allocator_init]",
}

// Every field of every public struct is read or written by the package:
// through its SWIG accessor (GetX / SetX) in Go, or by name in the C of
// bindings/go/swig/osftrt_go.i (the structs osftgo_call fills) and of the
// callbacks. A field appended to a header fails here until Go passes it.
func TestEveryHeaderStructFieldIsExposed(t *testing.T) {
	goSrc, cSrc := handWritten(t)
	structs := regexp.MustCompile(`(?s)typedef\s+struct\s+\w+\s*\{(.*?)\}\s*(osft_\w+_t)\s*;`)
	fnPtr := regexp.MustCompile(`\(\s*\*\s*(\w+)\s*\)`)
	array := regexp.MustCompile(`\[[^\]]*\]`)
	word := regexp.MustCompile(`\w+`)
	n := 0
	seen := map[string]bool{}
	for _, m := range structs.FindAllStringSubmatch(headerText(t), -1) {
		var fields []string
		for _, d := range strings.Split(m[1], ";") {
			if d = strings.TrimSpace(d); d == "" {
				continue
			}
			if f := fnPtr.FindStringSubmatch(d); f != nil {
				fields = append(fields, f[1])
				continue
			}
			for _, piece := range strings.Split(array.ReplaceAllString(d, ""), ",") {
				if w := word.FindAllString(piece, -1); len(w) > 0 {
					fields = append(fields, w[len(w)-1])
				}
			}
		}
		for _, f := range fields {
			if f == "struct_size" {
				continue
			}
			n++
			name := m[2] + "." + f
			seen[name] = true
			acc := strings_Title(f)
			inC := regexp.MustCompile(`(\.|->)` + f + `\b`).MatchString(cSrc)
			inGo := strings.Contains(goSrc, "Get"+acc+"(") || strings.Contains(goSrc, "Set"+acc+"(")
			_, skipped := fieldsNotExposed[name]
			switch {
			case skipped && (inC || inGo):
				t.Errorf("%s is used but listed in fieldsNotExposed", name)
			case !skipped && !inC && !inGo:
				t.Errorf("the header's field %s is neither read nor written by the Go package", name)
			}
		}
	}
	for name := range fieldsNotExposed {
		if !seen[name] {
			t.Errorf("fieldsNotExposed names %s, which no header declares", name)
		}
	}
	if n < 120 {
		t.Fatalf("only %d struct fields found in the headers", n)
	}
}

// SWIG's Go names capitalize the first letter.
func strings_Title(s string) string { return string(s[0]-'a'+'A') + s[1:] }

// Every status code of status.h has the header's value and a sentinel.
func TestStatusCodes(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(includeDir(), "osftrt", "status.h"))
	if err != nil {
		t.Fatal(err)
	}
	sentinels := map[string]*osftrt.Error{
		"INVALID_ARGUMENT": osftrt.ErrInvalidArgument, "INVALID_HANDLE": osftrt.ErrInvalidHandle,
		"INVALID_STRUCT_SIZE": osftrt.ErrInvalidStructSize, "DTYPE_MISMATCH": osftrt.ErrDTypeMismatch,
		"SHAPE_MISMATCH": osftrt.ErrShapeMismatch, "BAD_LAYOUT": osftrt.ErrBadLayout,
		"DEVICE_MISMATCH": osftrt.ErrDeviceMismatch, "ALIASING": osftrt.ErrAliasing,
		"INDEX_OUT_OF_RANGE": osftrt.ErrIndexOutOfRange, "OUT_OF_MEMORY": osftrt.ErrOutOfMemory,
		"NO_DEVICE": osftrt.ErrNoDevice, "NOT_SUPPORTED": osftrt.ErrNotSupported,
		"BACKEND_ERROR": osftrt.ErrBackendError, "COMM_ERROR": osftrt.ErrCommError,
		"TIMEOUT": osftrt.ErrTimeout, "NUMERICAL_ERROR": osftrt.ErrNumericalError,
		"INTERNAL_ERROR": osftrt.ErrInternalError,
	}
	n := 0
	for _, m := range regexp.MustCompile(`OSFT_STATUS_([A-Z_]+) = (\d+)`).FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		n++
		if m[1] == "SUCCESS" {
			if osftrt.StatusSuccess != osftrt.Status(v) {
				t.Errorf("SUCCESS is %d", osftrt.StatusSuccess)
			}
			continue
		}
		s, ok := sentinels[m[1]]
		if !ok {
			t.Errorf("status OSFT_STATUS_%s has no Go sentinel", m[1])
			continue
		}
		if s.Status != osftrt.Status(v) {
			t.Errorf("OSFT_STATUS_%s = %d, sentinel has %d", m[1], v, s.Status)
		}
		if s.Status.String() == "" || s.Status.String() == "unknown status" {
			t.Errorf("no name for %s", m[1])
		}
	}
	if n != len(sentinels)+1 {
		t.Errorf("%d statuses in status.h, %d sentinels", n, len(sentinels))
	}
}

func TestVersion(t *testing.T) {
	if err := osftrt.CheckVersion(); err != nil {
		t.Fatal(err)
	}
	if osftrt.VersionString() == "" || osftrt.BuildInfo() == "" {
		t.Fatal("empty version or build info")
	}
	if n, err := osftrt.DeviceCount(osftrt.DeviceCPU); err != nil || n != 1 {
		t.Fatalf("DeviceCount(CPU) = %d, %v", n, err)
	}
	if _, err := osftrt.DeviceCount(osftrt.DeviceType(77)); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("DeviceCount(77): %v", err)
	}
	threads, err := osftrt.NumThreads()
	if err != nil || threads < 1 {
		t.Fatalf("NumThreads() = %d, %v", threads, err)
	}
	if err := osftrt.SetNumThreads(-1); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("SetNumThreads(-1): %v", err)
	}
	if err := osftrt.SetNumThreads(threads + 1); err != nil {
		t.Fatal(err)
	}
	if n, _ := osftrt.NumThreads(); n != threads+1 {
		t.Fatalf("NumThreads() = %d after SetNumThreads(%d)", n, threads+1)
	}
	if err := osftrt.SetNumThreads(0); err != nil {
		t.Fatal(err)
	}
	if n, _ := osftrt.NumThreads(); n != threads {
		t.Fatalf("NumThreads() = %d after SetNumThreads(0), %d before", n, threads)
	}
	o := osftrt.DefaultFLCEOptions()
	if o.IgnoreIndex != -100 || o.Reduction != osftrt.ReduceMean {
		t.Fatalf("FLCE defaults %+v", o)
	}
	if osftrt.DefaultFLinearOptions().RankRatio != 0.5 || osftrt.DefaultCommOptions().TimeoutSeconds != 300 {
		t.Fatal("flinear / comm defaults")
	}
	if !osftrt.DefaultProjectorOptions().CheckConsistency {
		t.Fatal("projector default")
	}
	co := osftrt.DefaultContextOptions()
	if co.Device != osftrt.DeviceCPU || co.WorkspaceLimit != 0 || co.AllowTF32 {
		t.Fatalf("context defaults %+v", co)
	}
	co.AllowTF32 = true // ignored on the CPU
	ctx, err := osftrt.NewContext(&co)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	co.DeviceID = 3 // a device ordinal on the CPU is an argument error
	if _, err := osftrt.NewContext(&co); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("CPU context with device_id 3: %v", err)
	}
}

func newCtx(t testing.TB) *osftrt.Context {
	t.Helper()
	ctx, err := osftrt.NewContext(nil)
	if err != nil {
		t.Fatal(err)
	}
	return ctx
}

func TestCloseAndUseAfterClose(t *testing.T) {
	ctx := newCtx(t)
	ce, err := osftrt.NewFLCE(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("closing a context with an open handle: %v", err)
	}
	if err := ce.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ce.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	x := make([]float32, 8)
	err = ce.Compute(osftrt.FLCEInputs{X: osftrt.MustWrap(x, 2, 4), Weight: osftrt.MustWrap(x, 2, 4),
		Targets: osftrt.MustWrap([]int64{0, 1}, 2)}, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(make([]float32, 1), 1)})
	var e *osftrt.Error
	if !errors.Is(err, osftrt.ErrInvalidHandle) || !errors.As(err, &e) || e.Op != "FLCE.Compute" {
		t.Fatalf("use after close: %v", err)
	}
	if _, err := ce.Options(); !errors.Is(err, osftrt.ErrInvalidHandle) {
		t.Fatalf("Options after close: %v", err)
	}
	// a CTensor kept by a layer cannot be freed until the layer is closed
	layer, f := newFactorLayer(t, ctx, 6, 5)
	if err := f.ULow.Free(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("Free of a kept CTensor: %v", err)
	}
	if err := layer.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.ULow.Free(); err != nil {
		t.Fatal(err)
	}
	if err := f.ULow.Free(); err != nil {
		t.Fatal(err)
	}
	// a freed CTensor is refused, not dereferenced
	if _, err := osftrt.NewFLinearFromFactors(ctx, f, nil); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("a freed CTensor as a factor: %v", err)
	}
	if _, _, _, _, err := layer.Dims(); !errors.Is(err, osftrt.ErrInvalidHandle) {
		t.Fatalf("Dims after close: %v", err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := osftrt.NewFLCE(ctx, nil); !errors.Is(err, osftrt.ErrInvalidHandle) {
		t.Fatalf("NewFLCE on a closed context: %v", err)
	}
	if _, err := ctx.WorkspaceSize(); !errors.Is(err, osftrt.ErrInvalidHandle) {
		t.Fatalf("closed context: %v", err)
	}
}

// The finalizers close handles that were dropped without Close: the
// context refuses Close while they are open, and accepts it once the
// garbage collector has run their finalizers.
func TestFinalizers(t *testing.T) {
	ctx := newCtx(t)
	func() {
		for i := 0; i < 10; i++ {
			if _, err := osftrt.NewFLCE(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := osftrt.NewSelfComm(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
	}()
	if err := ctx.Close(); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("Close with 20 open handles: %v", err)
	}
	var err error
	for i := 0; i < 50; i++ {
		runtime.GC()
		if err = ctx.Close(); err == nil {
			return
		}
	}
	t.Fatalf("the finalizers did not close the dropped handles: %v", err)
}

func TestContextAndComm(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	if d, id, err := ctx.Device(); err != nil || d != osftrt.DeviceCPU || id != 0 {
		t.Fatalf("Device %v %v %v", d, id, err)
	}
	if err := ctx.ReserveWorkspace(1 << 16); err != nil {
		t.Fatal(err)
	}
	if n, err := ctx.WorkspaceSize(); err != nil || n < 1<<16 {
		t.Fatalf("workspace %d %v", n, err)
	}
	if s, err := ctx.MemoryStats(); err != nil || s.WorkspaceBytes < 1<<16 || s.HostInUse < s.WorkspaceBytes {
		t.Fatalf("stats %+v %v", s, err)
	}
	if err := ctx.SetStream(1234); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("a stream on a CPU context: %v", err)
	}
	for _, f := range []func() error{ctx.ReleaseWorkspace, ctx.ResetPeakMemory, ctx.Synchronize} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := ctx.Stream(); err != nil || s != 0 {
		t.Fatalf("stream %v %v", s, err)
	}
	c, err := osftrt.NewSelfComm(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, n, e, err := c.Info()
	if err != nil || r != 0 || n != 1 || e != osftrt.EngineSelf {
		t.Fatalf("Info %d %d %d %v", r, n, e, err)
	}
	buf := []float32{1.5, -2, 3}
	if err := c.AllreduceSum(osftrt.MustWrap(buf, 3)); err != nil || buf[1] != -2 {
		t.Fatalf("allreduce %v %v", buf, err)
	}
	recv := []float32{-9, -9, -9}
	if err := c.Allgather(osftrt.MustWrap(buf, 3), osftrt.MustWrap(recv, 3), []int64{3}); err != nil || recv[2] != 3 {
		t.Fatalf("allgather %v %v", recv, err)
	}
	if err := c.Barrier(); err != nil {
		t.Fatal(err)
	}
	if s, err := c.Stats(); err != nil || s.AllreduceCalls != 1 || s.AllgatherCalls != 1 {
		t.Fatalf("stats %+v %v", s, err)
	}
	if err := c.ResetStats(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Info(); err != nil {
		t.Fatal(err)
	}
	if osftrt.HasFeature(osftrt.FeatureNCCL) {
		t.Log("NCCL compiled in")
	} else if _, err := osftrt.NewNCCLUniqueID(); !errors.Is(err, osftrt.ErrNotSupported) {
		t.Fatalf("NCCL id without NCCL: %v", err)
	}
}

// Go collectives behind a communicator (one rank): the library calls them.
type goColl struct {
	mu                  sync.Mutex
	allreduces, gathers int
}

func (g *goColl) Rank() int { return 0 }
func (g *goColl) Size() int { return 1 }
func (g *goColl) AllreduceSum(b *osftrt.Buffer) error {
	g.mu.Lock()
	g.allreduces++
	g.mu.Unlock()
	return nil
}
func (g *goColl) Allgather(send, recv *osftrt.Buffer, counts []int64) error {
	g.mu.Lock()
	g.gathers++
	g.mu.Unlock()
	copy(recv.Float32s(), send.Float32s())
	return nil
}

func TestCallbackComm(t *testing.T) {
	ctx := newCtx(t)
	defer ctx.Close()
	g := &goColl{}
	c, err := osftrt.NewCallbackComm(ctx, g, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := []float32{1, 2}
	if err := c.AllreduceSum(osftrt.MustWrap(buf, 2)); err != nil {
		t.Fatal(err)
	}
	recv := make([]float32, 2)
	if err := c.Allgather(osftrt.MustWrap(buf, 2), osftrt.MustWrap(recv, 2), []int64{2}); err != nil {
		t.Fatal(err)
	}
	if g.allreduces != 1 || g.gathers != 1 || recv[1] != 2 {
		t.Fatalf("callbacks: %d allreduces, %d gathers, recv %v", g.allreduces, g.gathers, recv)
	}
	if _, _, e, _ := c.Info(); e != osftrt.EngineCallbacks {
		t.Fatalf("engine %v", e)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestLogSink(t *testing.T) {
	var mu sync.Mutex
	var got []string
	if err := osftrt.SetLogSink(func(l osftrt.LogLevel, m string) {
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
	}, osftrt.LogError); err != nil {
		t.Fatal(err)
	}
	_, err := osftrt.DeviceCount(osftrt.DeviceType(77))
	if err := osftrt.SetLogSink(nil, osftrt.LogOff); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var e *osftrt.Error
	if !errors.As(err, &e) || len(got) != 1 || got[0] != e.Message {
		t.Fatalf("log sink got %q, error %v", got, err)
	}
	if err := osftrt.SetLogSink(func(osftrt.LogLevel, string) {}, osftrt.LogLevel(99)); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("bad level: %v", err)
	}
}

func TestCTensorAndWrapChecks(t *testing.T) {
	if _, err := osftrt.Wrap(make([]float32, 5), 2, 3); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("short slice: %v", err)
	}
	ct, err := osftrt.NewCTensor(osftrt.Float64, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := osftrt.CopyFrom(ct, []float64{1, 2, 3, 4, 5, 6}); err != nil {
		t.Fatal(err)
	}
	v, err := osftrt.CopyTo[float64](ct)
	if err != nil || v[5] != 6 || ct.Float64s()[0] != 1 {
		t.Fatalf("CopyTo %v %v", v, err)
	}
	if err := osftrt.CopyFrom(ct, []float32{1}); !errors.Is(err, osftrt.ErrInvalidArgument) {
		t.Fatalf("CopyFrom of the wrong type: %v", err)
	}
	if b := osftrt.ToBF16(1.5); b.Float32() != 1.5 {
		t.Fatal("bf16")
	}
	if err := ct.Free(); err != nil {
		t.Fatal(err)
	}
	if math.IsNaN(0) {
		t.Fatal()
	}
}
