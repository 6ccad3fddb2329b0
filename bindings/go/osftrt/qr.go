package osftrt

import (
	"math"
	"unsafe"

	"libosftrt/osftrt/internal/capi"
)

// QRMethod is how each matrix is factored (osft_qr_method_t).
type QRMethod int

// Methods.
var (
	QRHouseholder = QRMethod(capi.OSFT_QR_HOUSEHOLDER)
	QRCholeskyQR2 = QRMethod(capi.OSFT_QR_CHOLESKY_QR2)
	// QRCholeskyTF32: fp32 matrices, three CholeskyQR passes whose Gram
	// matrices are TF32 GEMMs, then a last pass with an fp64 Gram matrix;
	// checked, with the Householder fall-back; fp64 matrices run
	// CholeskyQR2 (library 1.2.0).
	QRCholeskyTF32 = QRMethod(capi.OSFT_QR_CHOLESKY_TF32)
)

// QROptions (osft_qr_options_t); every default is 0: Householder, default
// thresholds, default concurrency, rank-deficient matrices fail.
type QROptions struct {
	Method                 QRMethod
	OrthogonalityThreshold float64
	RankTolerance          float64
	MaxConcurrency         int
	// RankDeficient (osft_qr_options_t.rank_deficient, library 1.4.0) says
	// what a matrix (power iteration: a product A_i Q_i at any iteration)
	// that is rank-deficient to RankTolerance gets.
	//
	// nil, the default: it fails alone, StatusNumericalError in its entry
	// of the returned statuses, its outputs untouched, and the call returns
	// an error matching ErrNumericalError (the others are written).
	//
	// A slice of one bool per matrix (power iteration: per pair), which
	// the call fills: such a matrix is factored anyway (Householder QR is
	// defined for any finite matrix: Q orthonormal to working precision,
	// Q R = A, diag(R) >= 0; the columns of Q beyond the numerical rank are
	// an orthonormal complement that rounding chose), written, its status
	// is StatusSuccess, and its entry is set to true; every other entry is
	// set to false. Matrices with NaN or Inf, or whose result overflows,
	// still fail (false here). The slice is written whenever the statuses
	// are returned (success, or an error matching ErrNumericalError) and
	// left as it was on any other error. A length other than the number of
	// matrices is an ErrInvalidArgument before the call.
	RankDeficient []bool
}

// DefaultQROptions returns the defaults of osft_qr_options_init.
func DefaultQROptions() QROptions {
	o := capi.NewOsft_qr_options_t()
	defer capi.DeleteOsft_qr_options_t(o)
	return QROptions{Method: QRMethod(o.GetMethod()), OrthogonalityThreshold: o.GetOrthogonality_threshold(),
		RankTolerance: o.GetRank_tolerance(), MaxConcurrency: o.GetMax_concurrency()}
}

// setQROptions puts opts into the call buffer by value (osftgo_qr builds
// the C struct): no C allocation and no cgo call per field.
func setQROptions(b *callBuf, opts *QROptions) {
	if opts == nil {
		return
	}
	b.i[0] = 1
	b.i[1] = int64(opts.Method)
	b.i[2] = int64(opts.MaxConcurrency)
	b.h[0] = math.Float64bits(opts.OrthogonalityThreshold)
	b.h[1] = math.Float64bits(opts.RankTolerance)
}

// staged is a Go-slice tensor of a QR list, copied into the context's
// staging buffer at byte offset off.
type staged struct {
	t   *Tensor
	off int64
	n   int64 // bytes
}

func (s *staged) in(stage []byte) {
	copy(stage[s.off:s.off+s.n], unsafe.Slice((*byte)(s.t.ptr), s.n))
}

func (s *staged) back(stage []byte) {
	copy(unsafe.Slice((*byte)(s.t.ptr), s.n), stage[s.off:s.off+s.n])
}

// qrList runs osft_qr_batch (power 0) or osft_qr_power_iteration. The list
// entries are passed by descriptor; entries that are Go slices (*Tensor)
// are copied into one pointer-free staging buffer of the context (reused
// between calls) for the call and their results copied back, since a list
// of Go pointers cannot be handed to C (cgo forbids Go memory that holds Go
// pointers). CTensors go through without a copy.
func qrList(ctx *Context, op string, opts *QROptions, a, q, r []Arg, power int) ([]Status, error) {
	n := len(a)
	if q != nil && len(q) != n {
		return nil, errArg(op, "%d Q entries for %d matrices", len(q), n)
	}
	if r != nil && len(r) != n {
		return nil, errArg(op, "%d R entries for %d matrices", len(r), n)
	}
	var rankFlags []bool
	if opts != nil && opts.RankDeficient != nil {
		if len(opts.RankDeficient) != n {
			return nil, errArg(op, "%d RankDeficient entries for %d matrices", len(opts.RankDeficient), n)
		}
		rankFlags = opts.RankDeficient
	}
	c, err := ctx.lock(op)
	if err != nil {
		return nil, err
	}
	defer ctx.mu.Unlock()
	descs := reuse(&ctx.descs, 3*n+1)
	for k := range descs {
		descs[k] = cDesc{}
	}
	var stg []staged
	var outs []int // indices into stg
	total := int64(0)
	var held []*CTensor
	defer func() {
		for _, ct := range held {
			ct.unuse()
		}
	}()
	fill := func(k int, x Arg, isOut bool) error {
		x = argOf(x)
		if x == nil {
			return nil
		}
		if ct, ok := x.(*CTensor); ok { // held for the call: Free refuses meanwhile
			if err := ct.use(); err != nil {
				return errArg(op, "a CTensor used after Free")
			}
			held = append(held, ct)
		}
		if _, err := x.describe(&descs[k]); err != nil {
			return err
		}
		if t, ok := x.(*Tensor); ok {
			e, err := extent(t.shape, t.strides)
			if err != nil {
				return errArg(op, "%v", err)
			}
			nb := e * int64(t.dtype.Size())
			descs[k].present = 3 // an offset into the staging buffer
			descs[k].data = uint64(total)
			if isOut {
				outs = append(outs, len(stg))
			}
			stg = append(stg, staged{t: t, off: total, n: nb})
			total += (nb + 63) &^ 63
		}
		return nil
	}
	for i := 0; i < n; i++ {
		if a[i] == nil {
			return nil, errArg(op, "a[%d] is nil", i)
		}
		inplace := q == nil || argOf(q[i]) == nil
		if err := fill(3*i, a[i], inplace); err != nil {
			return nil, err
		}
		if q != nil {
			if err := fill(3*i+1, q[i], true); err != nil {
				return nil, err
			}
		}
		if r != nil {
			if err := fill(3*i+2, r[i], true); err != nil {
				return nil, err
			}
		}
	}
	var stage []byte
	if len(stg) > 0 {
		stage = reuse(&ctx.stage, int(total))
		for k := range stg {
			stg[k].in(stage)
		}
	}
	status := reuse(&ctx.statuses, n+1)
	b := ctx.buf
	b.reset()
	setQROptions(b, opts)
	var stagePtr unsafe.Pointer
	if len(stage) > 0 {
		stagePtr = unsafe.Pointer(&stage[0])
	}
	var flags []int32 // the C int array of osft_qr_options_t.rank_deficient
	var flagsPtr unsafe.Pointer
	if rankFlags != nil {
		flags = reuse(&ctx.rankFlags, n+1)
		flagsPtr = unsafe.Pointer(&flags[0])
	}
	st := capi.Osftgo_qr(uint64(c), int64(n), power, unsafe.Pointer(b),
		unsafe.Pointer(&descs[0]), stagePtr, unsafe.Pointer(&status[0]), flagsPtr)
	var res []Status
	if st == capi.OSFT_STATUS_SUCCESS || Status(st) == StatusNumericalError {
		for _, k := range outs {
			stg[k].back(stage)
		}
		res = make([]Status, n)
		for i := range res {
			res[i] = Status(status[i])
		}
		for i := range rankFlags {
			rankFlags[i] = flags[i] != 0
		}
	}
	if st != capi.OSFT_STATUS_SUCCESS {
		return res, &Error{Status: Status(st), Op: op, Message: b.message()}
	}
	return res, nil
}

// QRBatch factors every a[i] = Q_i R_i (m x n, m >= n; fp32 or fp64,
// row-major). q nil writes each Q over its A (in place); r nil, or nil
// entries, skip R. Returns the per-matrix statuses; on a per-matrix
// failure the error matches ErrNumericalError and the others are written.
// A matrix that is rank-deficient to opts.RankTolerance is such a failure
// unless opts.RankDeficient is given, which asks to factor it and report
// it there:
//
//	o := osftrt.DefaultQROptions()
//	o.RankDeficient = make([]bool, len(a))
//	st, err := osftrt.QRBatch(ctx, &o, a, q, r) // o.RankDeficient[i]: factored although singular
func QRBatch(ctx *Context, opts *QROptions, a, q, r []Arg) ([]Status, error) {
	return qrList(ctx, "QRBatch", opts, a, q, r, 0)
}

// QRPowerIteration runs Q_i <- qr(A_i Q_i) `iterations` times (q in place).
// A pair fails alone (its Q_i unchanged) if A_i or Q_i has NaN or Inf, or if
// a product A_i Q_i overflows or is rank-deficient; with opts.RankDeficient
// given, a rank-deficient product is factored instead and the pair flagged
// there (SOAP/Shampoo preconditioner factors are often singular).
func QRPowerIteration(ctx *Context, opts *QROptions, a, q []Arg, iterations int) ([]Status, error) {
	if iterations < 1 {
		return nil, errArg("QRPowerIteration", "iterations %d < 1", iterations)
	}
	if q == nil {
		return nil, errArg("QRPowerIteration", "q is required")
	}
	return qrList(ctx, "QRPowerIteration", opts, a, q, nil, iterations)
}
