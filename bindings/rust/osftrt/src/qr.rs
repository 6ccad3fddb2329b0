//! Batched QR factorization and fused power iteration (`osftrt/qr.h`).
use std::os::raw::c_int;
use std::ptr;

use osftrt_sys as sys;

use crate::context::Context;
use crate::error::{check, Error, Result, Status};
use crate::tensor::{Tensor, TensorMut};

/// How each matrix is factored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QrMethod {
    /// Blocked Householder: stable at any condition number (the default).
    Householder,
    /// CholeskyQR2, checked per matrix, with a Householder fall-back.
    CholeskyQr2,
    /// For fp32 matrices: three CholeskyQR passes whose Gram matrices are
    /// TF32 GEMMs, then a last pass with an fp64 Gram matrix; checked, with the Householder
    /// fall-back. fp64 matrices run [`QrMethod::CholeskyQr2`]. (Library 1.2.)
    CholeskyTf32,
}

/// What a matrix that is rank-deficient to [`QrOptions::rank_tolerance`]
/// gets (`osft_qr_options_t.rank_deficient`, library 1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RankDeficient {
    /// It fails alone (the default, the library's NULL): the call returns
    /// [`Status::NumericalError`] with the matrix in
    /// [`Error::failed_indices`], its outputs untouched, the others written.
    Fail,
    /// It is factored anyway and reported: Householder QR is defined for
    /// any finite matrix, so its Q (orthonormal to working precision,
    /// `Q R = A`, `diag(R) >= 0`; the columns beyond the numerical rank are
    /// an orthonormal complement that rounding chose) and R are written and
    /// it is not a failure; its index is in [`QrReport::rank_deficient`]
    /// (or, when another matrix failed, in
    /// [`Error::rank_deficient_indices`]). Matrices with NaN or Inf, or
    /// whose result overflows, still fail. For SOAP/Shampoo refreshes,
    /// whose preconditioner factors are often singular.
    Factor,
}

/// Options of the QR calls; `Default` is the library's defaults (all 0:
/// Householder, default thresholds and concurrency, [`RankDeficient::Fail`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QrOptions {
    /// The method.
    pub method: QrMethod,
    /// CholeskyQR2's accepted loss of orthogonality (0: 0.5).
    pub orthogonality_threshold: f64,
    /// Relative rank tolerance (0: max(m, n) eps; negative: no check).
    pub rank_tolerance: f64,
    /// Most workers per call (0: the default).
    pub max_concurrency: i32,
    /// What a rank-deficient matrix (power iteration: a product `A_i Q_i`
    /// at any iteration) gets (library 1.4; default
    /// [`RankDeficient::Fail`]).
    pub rank_deficient: RankDeficient,
}

/// What a QR call that succeeded reports besides its outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QrReport {
    /// The indices of the matrices (power iteration: pairs) that were
    /// rank-deficient and factored anyway, in increasing order; always
    /// empty with [`RankDeficient::Fail`].
    pub rank_deficient: Vec<usize>,
}

impl Default for QrOptions {
    fn default() -> Self {
        let o = raw_options();
        QrOptions {
            method: match o.method {
                sys::OSFT_QR_CHOLESKY_QR2 => QrMethod::CholeskyQr2,
                sys::OSFT_QR_CHOLESKY_TF32 => QrMethod::CholeskyTf32,
                _ => QrMethod::Householder,
            },
            orthogonality_threshold: o.orthogonality_threshold,
            rank_tolerance: o.rank_tolerance,
            max_concurrency: o.max_concurrency,
            rank_deficient: if o.rank_deficient.is_null() {
                RankDeficient::Fail
            } else {
                RankDeficient::Factor
            },
        }
    }
}

fn raw_options() -> sys::osft_qr_options_t {
    // SAFETY: all-zero is a valid osft_qr_options_t; the init call writes
    // exactly the size it is given.
    unsafe {
        let mut o: sys::osft_qr_options_t = std::mem::zeroed();
        sys::osft_qr_options_init(&mut o, std::mem::size_of_val(&o));
        o
    }
}

impl QrOptions {
    /// The C struct; `flags` becomes `rank_deficient` (NULL, or an array of
    /// one `int` per matrix that outlives the call it is passed to).
    fn to_raw(self, flags: *mut c_int) -> sys::osft_qr_options_t {
        // Every default of osft_qr_options_t is 0 (qr.h), so a zeroed struct
        // with struct_size set is exactly what osft_qr_options_init writes;
        // building it here saves a library call per QR call.
        // SAFETY: all-zero is a valid osft_qr_options_t.
        let mut o: sys::osft_qr_options_t = unsafe { std::mem::zeroed() };
        o.struct_size = std::mem::size_of::<sys::osft_qr_options_t>();
        o.method = match self.method {
            QrMethod::Householder => sys::OSFT_QR_HOUSEHOLDER,
            QrMethod::CholeskyQr2 => sys::OSFT_QR_CHOLESKY_QR2,
            QrMethod::CholeskyTf32 => sys::OSFT_QR_CHOLESKY_TF32,
        };
        o.orthogonality_threshold = self.orthogonality_threshold;
        o.rank_tolerance = self.rank_tolerance;
        o.max_concurrency = self.max_concurrency;
        o.rank_deficient = flags;
        o
    }
}

// Small lists stay on the stack: no allocation per call for up to this many
// matrices (the per-call overhead benchmark calls with a few).
const INLINE: usize = 8;

/// The first `n` entries of `inline` (or, for longer lists, `heap`) set to
/// `f(i)`, written in place: the descriptor arrays are never moved, which
/// keeps the per-call copying small.
fn fill<'s, T>(
    inline: &'s mut [T; INLINE],
    heap: &'s mut Vec<T>,
    n: usize,
    mut f: impl FnMut(usize) -> T,
) -> &'s mut [T] {
    if n <= INLINE {
        for (i, slot) in inline.iter_mut().enumerate().take(n) {
            *slot = f(i);
        }
        &mut inline[..n]
    } else {
        heap.extend((0..n).map(f));
        heap
    }
}

fn zeroed_descs() -> [sys::DLTensor; INLINE] {
    // SAFETY: all-zero is a valid DLTensor (NULL pointers, zeros); only
    // entries written by `fill` are ever handed to the library.
    unsafe { std::mem::zeroed() }
}

/// The `osft_qr_options_t.rank_deficient` array of one call: NULL for
/// [`RankDeficient::Fail`], else `n` ints, on the stack for short lists.
struct RankFlags {
    inline: [c_int; INLINE],
    heap: Vec<c_int>,
    n: usize,
    wanted: bool,
}

impl RankFlags {
    fn new(opts: &QrOptions, n: usize) -> RankFlags {
        let wanted = opts.rank_deficient == RankDeficient::Factor;
        RankFlags {
            inline: [0; INLINE],
            heap: if wanted && n > INLINE {
                vec![0; n]
            } else {
                Vec::new()
            },
            n,
            wanted,
        }
    }

    fn as_mut_ptr(&mut self) -> *mut c_int {
        match (self.wanted, self.n > INLINE) {
            (false, _) => ptr::null_mut(),
            (true, false) => self.inline.as_mut_ptr(),
            (true, true) => self.heap.as_mut_ptr(),
        }
    }

    /// The flagged indices (the library wrote the array: the call got as
    /// far as the per-matrix statuses).
    fn indices(&self) -> Vec<usize> {
        if !self.wanted {
            return Vec::new();
        }
        let v = if self.n > INLINE {
            &self.heap[..]
        } else {
            &self.inline[..self.n]
        };
        v.iter()
            .enumerate()
            .filter(|(_, &f)| f != 0)
            .map(|(i, _)| i)
            .collect()
    }
}

fn per_matrix_result(
    code: sys::osft_status_t,
    statuses: &[sys::osft_status_t],
    flags: &RankFlags,
) -> Result<QrReport> {
    if code == sys::OSFT_STATUS_NUMERICAL_ERROR {
        let failed = statuses
            .iter()
            .enumerate()
            .filter(|(_, &s)| s != sys::OSFT_STATUS_SUCCESS)
            .map(|(i, _)| i)
            .collect();
        return Err(Error::last(code)
            .with_failed(failed)
            .with_rank_deficient(flags.indices()));
    }
    check(code)?;
    Ok(QrReport {
        rank_deficient: flags.indices(),
    })
}

fn count_mismatch(what: &str, n: usize, m: usize) -> Error {
    Error::new(
        Status::InvalidArgument,
        format!("qr: {n} matrices but {m} {what}"),
    )
}

impl Context {
    /// Thin QR factorizations `A_i = Q_i R_i` of a list of matrices (mixed
    /// shapes and dtypes, f32 or f64, `m_i >= n_i`), with `diag(R) >= 0`.
    /// `r` may be `None` (no R wanted) or hold one optional output per
    /// matrix.
    ///
    /// A matrix that is non-finite or rank-deficient fails alone: the call
    /// returns [`Status::NumericalError`] with
    /// [`Error::failed_indices`], leaves those matrices' outputs untouched
    /// and writes the others. With [`RankDeficient::Factor`] a
    /// rank-deficient matrix is factored instead and its index returned in
    /// [`QrReport::rank_deficient`].
    ///
    /// ```
    /// use osftrt::{Context, QrOptions, RankDeficient, Tensor, TensorMut};
    /// let ctx = Context::cpu()?;
    /// let a = [3.0f64, 1.0, 4.0, 1.0, 0.0, 2.0]; // 3 x 2
    /// let (mut q, mut r) = ([0.0f64; 6], [0.0f64; 4]);
    /// ctx.qr_batch(&QrOptions::default(), &[Tensor::new(&a, &[3, 2])?],
    ///              &mut [TensorMut::new(&mut q, &[3, 2])?],
    ///              Some(&mut [Some(TensorMut::new(&mut r, &[2, 2])?)]))?;
    /// assert!(r[0] > 0.0 && r[2] == 0.0); // upper triangular, positive diagonal
    ///
    /// // Two equal columns: rank 1. Factored and reported instead of failing.
    /// let s = [1.0f64, 1.0, 2.0, 2.0, 3.0, 3.0];
    /// let opts = QrOptions { rank_deficient: RankDeficient::Factor, ..Default::default() };
    /// let report = ctx.qr_batch(&opts, &[Tensor::new(&s, &[3, 2])?],
    ///                           &mut [TensorMut::new(&mut q, &[3, 2])?], None)?;
    /// assert_eq!(report.rank_deficient, [0]);
    /// # Ok::<(), osftrt::Error>(())
    /// ```
    pub fn qr_batch(
        &self,
        opts: &QrOptions,
        a: &[Tensor<'_>],
        q: &mut [TensorMut<'_>],
        r: Option<&mut [Option<TensorMut<'_>>]>,
    ) -> Result<QrReport> {
        let n = a.len();
        if q.len() != n {
            return Err(count_mismatch("q outputs", n, q.len()));
        }
        if let Some(r) = &r {
            if r.len() != n {
                return Err(count_mismatch("r entries", n, r.len()));
            }
        }
        let (mut a_in, mut q_in, mut r_in) = (zeroed_descs(), zeroed_descs(), zeroed_descs());
        let (mut a_heap, mut q_heap, mut r_heap) = (Vec::new(), Vec::new(), Vec::new());
        let ad = fill(&mut a_in, &mut a_heap, n, |i| a[i].dl());
        let qd = fill(&mut q_in, &mut q_heap, n, |i| q[i].dl());
        let (mut ap_in, mut qp_in, mut rp_in) = (
            [ptr::null(); INLINE],
            [ptr::null_mut(); INLINE],
            [ptr::null_mut(); INLINE],
        );
        let (mut ap_heap, mut qp_heap, mut rp_heap) = (Vec::new(), Vec::new(), Vec::new());
        let ap = fill(&mut ap_in, &mut ap_heap, n, |i| {
            &ad[i] as *const sys::DLTensor
        });
        let qbase = qd.as_mut_ptr();
        let qp = fill(&mut qp_in, &mut qp_heap, n, |i| qbase.wrapping_add(i));
        // R: a descriptor per present output, NULL pointers for None.
        let rp: *const *mut sys::DLTensor = match r {
            None => ptr::null(),
            Some(r) => {
                let rd = fill(&mut r_in, &mut r_heap, n, |i| match &mut r[i] {
                    Some(t) => t.dl(),
                    // SAFETY: all-zero is a valid DLTensor; never passed
                    // (its pointer is NULL below).
                    None => unsafe { std::mem::zeroed() },
                });
                let rbase = rd.as_mut_ptr();
                fill(&mut rp_in, &mut rp_heap, n, |i| {
                    if r[i].is_some() {
                        rbase.wrapping_add(i)
                    } else {
                        ptr::null_mut()
                    }
                })
                .as_ptr()
            }
        };
        let mut st_in = [0 as sys::osft_status_t; INLINE];
        let mut st_heap = Vec::new();
        let st = fill(&mut st_in, &mut st_heap, n, |_| 0);
        let mut flags = RankFlags::new(opts, n);
        let o = opts.to_raw(flags.as_mut_ptr());
        // SAFETY: every descriptor points at memory borrowed by `a` (shared)
        // or `q`/`r` (exclusive) for this call; the pointer arrays hold `n`
        // entries each, pointing into descriptor arrays that stay in place
        // until the call returns; `st` holds `n` statuses; `o.rank_deficient`
        // is NULL or points at `flags`' `n` ints, which stay in place until
        // the call returns; the context is live.
        let code = unsafe {
            sys::osft_qr_batch(
                self.as_raw(),
                &o,
                n,
                ap.as_ptr(),
                qp.as_ptr(),
                rp,
                st.as_mut_ptr(),
            )
        };
        per_matrix_result(code, st, &flags)
    }

    /// In-place QR: each `Q_i` overwrites its `A_i` (failures and
    /// [`QrOptions::rank_deficient`] as for [`Context::qr_batch`]).
    pub fn qr_batch_in_place(&self, opts: &QrOptions, a: &mut [TensorMut<'_>]) -> Result<QrReport> {
        let n = a.len();
        let mut a_in = zeroed_descs();
        let mut a_heap = Vec::new();
        let ad = fill(&mut a_in, &mut a_heap, n, |i| a[i].dl());
        let (mut ap_in, mut ap_heap) = ([ptr::null(); INLINE], Vec::new());
        let abase = ad.as_mut_ptr();
        let ap = fill(&mut ap_in, &mut ap_heap, n, |i| {
            abase.wrapping_add(i) as *const sys::DLTensor
        });
        let (mut st_in, mut st_heap) = ([0 as sys::osft_status_t; INLINE], Vec::new());
        let st = fill(&mut st_in, &mut st_heap, n, |_| 0);
        let mut flags = RankFlags::new(opts, n);
        let o = opts.to_raw(flags.as_mut_ptr());
        // SAFETY: descriptors of memory borrowed exclusively by `a`, in
        // place until the call returns; q NULL means "in place"; `st` holds
        // n statuses; `o.rank_deficient` as in qr_batch.
        let code = unsafe {
            sys::osft_qr_batch(
                self.as_raw(),
                &o,
                n,
                ap.as_ptr(),
                ptr::null(),
                ptr::null(),
                st.as_mut_ptr(),
            )
        };
        per_matrix_result(code, st, &flags)
    }

    /// Power iteration: `iterations` times `Q_i <- qr(A_i Q_i)` for square
    /// `A_i` (m x m) and `Q_i` (m x n), e.g. to refresh SOAP/Shampoo bases.
    ///
    /// A pair fails alone (its `Q_i` unchanged) if `A_i` or `Q_i` has NaN
    /// or Inf, or a product `A_i Q_i` overflows or is rank-deficient; with
    /// [`RankDeficient::Factor`] a rank-deficient product (a singular
    /// preconditioner factor) is factored instead and the pair's index is
    /// in [`QrReport::rank_deficient`].
    pub fn qr_power_iteration(
        &self,
        opts: &QrOptions,
        a: &[Tensor<'_>],
        q: &mut [TensorMut<'_>],
        iterations: i32,
    ) -> Result<QrReport> {
        let n = a.len();
        if q.len() != n {
            return Err(count_mismatch("q matrices", n, q.len()));
        }
        let (mut a_in, mut q_in) = (zeroed_descs(), zeroed_descs());
        let (mut a_heap, mut q_heap) = (Vec::new(), Vec::new());
        let ad = fill(&mut a_in, &mut a_heap, n, |i| a[i].dl());
        let qd = fill(&mut q_in, &mut q_heap, n, |i| q[i].dl());
        let (mut ap_in, mut qp_in) = ([ptr::null(); INLINE], [ptr::null_mut(); INLINE]);
        let (mut ap_heap, mut qp_heap) = (Vec::new(), Vec::new());
        let ap = fill(&mut ap_in, &mut ap_heap, n, |i| {
            &ad[i] as *const sys::DLTensor
        });
        let qbase = qd.as_mut_ptr();
        let qp = fill(&mut qp_in, &mut qp_heap, n, |i| qbase.wrapping_add(i));
        let (mut st_in, mut st_heap) = ([0 as sys::osft_status_t; INLINE], Vec::new());
        let st = fill(&mut st_in, &mut st_heap, n, |_| 0);
        let mut flags = RankFlags::new(opts, n);
        let o = opts.to_raw(flags.as_mut_ptr());
        // SAFETY: as in qr_batch.
        let code = unsafe {
            sys::osft_qr_power_iteration(
                self.as_raw(),
                &o,
                n,
                ap.as_ptr(),
                qp.as_ptr(),
                iterations,
                st.as_mut_ptr(),
            )
        };
        per_matrix_result(code, st, &flags)
    }
}
