//! The factorized linear (OSFT) layer: `y = x W^T + b` with `W` kept as its
//! SVD split into a frozen and a trainable part (`osftrt/flinear.h`).
use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr;

use osftrt_sys as sys;

use crate::context::Context;
use crate::error::{check, Error, Result, Status};
use crate::tensor::{opt_dl, opt_dl_mut, opt_ptr, opt_ptr_mut, DType, Element, Tensor, TensorMut};

/// How a layer computes its passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The cost model picks per call.
    Auto,
    /// GEMMs on the factors.
    Factorized,
    /// A cached frozen product plus the rebuilt low part.
    Dense,
    /// The dense forward and grad_x, the trainable factors' gradients from
    /// the factors: the cheapest for many tokens and a small trainable
    /// rank (library 1.3.0).
    Hybrid,
}

impl Strategy {
    fn raw(self) -> sys::osft_flinear_strategy_t {
        match self {
            Strategy::Auto => sys::OSFT_FLINEAR_AUTO,
            Strategy::Factorized => sys::OSFT_FLINEAR_FACTORIZED,
            Strategy::Dense => sys::OSFT_FLINEAR_DENSE,
            Strategy::Hybrid => sys::OSFT_FLINEAR_HYBRID,
        }
    }
    fn from_raw(s: sys::osft_flinear_strategy_t) -> Strategy {
        match s {
            sys::OSFT_FLINEAR_FACTORIZED => Strategy::Factorized,
            sys::OSFT_FLINEAR_DENSE => Strategy::Dense,
            sys::OSFT_FLINEAR_HYBRID => Strategy::Hybrid,
            _ => Strategy::Auto,
        }
    }
}

/// One of the six factors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Factor {
    /// Frozen U (N x r).
    UHigh,
    /// Frozen S (r).
    SHigh,
    /// Frozen V rows (r x K).
    VHigh,
    /// Trainable U (N x l).
    ULow,
    /// Trainable S (l).
    SLow,
    /// Trainable V rows (l x K).
    VLow,
}

impl Factor {
    fn raw(self) -> sys::osft_flinear_factor_t {
        match self {
            Factor::UHigh => sys::OSFT_FACTOR_U_HIGH,
            Factor::SHigh => sys::OSFT_FACTOR_S_HIGH,
            Factor::VHigh => sys::OSFT_FACTOR_V_HIGH,
            Factor::ULow => sys::OSFT_FACTOR_U_LOW,
            Factor::SLow => sys::OSFT_FACTOR_S_LOW,
            Factor::VLow => sys::OSFT_FACTOR_V_LOW,
        }
    }
    fn frozen(self) -> bool {
        matches!(self, Factor::UHigh | Factor::SHigh | Factor::VHigh)
    }
}

/// How a layer learns that its trainable factors changed (library 1.3.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Updates {
    /// The runtime finds out by itself: it fingerprints the trainable
    /// factors on the CPU and rebuilds W at every call elsewhere.
    Detected,
    /// The caller reports every change ([`FLinear::mark_updated`]; a view
    /// of U_low, S_low or V_low through [`FLinear::with_factor`] or
    /// [`FLinear::with_factor_mut`] counts as one) and the rebuilt W is
    /// kept until the next report.
    Reported,
}

impl Updates {
    fn raw(self) -> sys::osft_flinear_updates_t {
        match self {
            Updates::Detected => sys::OSFT_FLINEAR_UPDATES_DETECTED,
            Updates::Reported => sys::OSFT_FLINEAR_UPDATES_REPORTED,
        }
    }
    fn from_raw(u: sys::osft_flinear_updates_t) -> Updates {
        match u {
            sys::OSFT_FLINEAR_UPDATES_REPORTED => Updates::Reported,
            _ => Updates::Detected,
        }
    }
}

/// Which pass a strategy query is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// The forward.
    Forward,
    /// The backward.
    Backward,
}

/// Options of a layer; `Default` is the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlinearOptions {
    /// Frozen fraction of the rank, in (0, 1). Default 0.5.
    pub rank_ratio: f64,
    /// Default [`Strategy::Auto`].
    pub strategy: Strategy,
    /// dtype of runtime-owned factors (F32 or Bf16); `None`: the weight's.
    pub factor_dtype: Option<DType>,
    /// How the layer learns of changes to its trainable factors. Default
    /// [`Updates::Detected`] (library 1.3.0).
    pub trainable_updates: Updates,
}

fn raw_options() -> sys::osft_flinear_options_t {
    // SAFETY: all-zero is a valid osft_flinear_options_t; the init call
    // writes exactly the size it is given.
    unsafe {
        let mut o: sys::osft_flinear_options_t = std::mem::zeroed();
        sys::osft_flinear_options_init(&mut o, std::mem::size_of_val(&o));
        o
    }
}

impl Default for FlinearOptions {
    fn default() -> Self {
        let o = raw_options();
        FlinearOptions {
            rank_ratio: o.rank_ratio,
            strategy: Strategy::from_raw(o.strategy),
            factor_dtype: None,
            trainable_updates: Updates::from_raw(o.trainable_updates),
        }
    }
}

impl FlinearOptions {
    fn to_raw(self) -> sys::osft_flinear_options_t {
        let mut o = raw_options();
        o.rank_ratio = self.rank_ratio;
        o.strategy = self.strategy.raw();
        o.trainable_updates = self.trainable_updates.raw();
        if let Some(d) = self.factor_dtype {
            o.factor_dtype = d.to_dl();
        }
        o
    }
}

/// Caller-owned factors for [`FLinear::from_factors`]: all six of one dtype
/// (f32 or bf16). The layer borrows them mutably for its whole life (it
/// reads them at every call and re-decomposition overwrites them); reach
/// them meanwhile through [`FLinear::with_factor_mut`].
pub struct Factors<'a> {
    /// N x r.
    pub u_high: TensorMut<'a>,
    /// r.
    pub s_high: TensorMut<'a>,
    /// r x K.
    pub v_high: TensorMut<'a>,
    /// N x l.
    pub u_low: TensorMut<'a>,
    /// l.
    pub s_low: TensorMut<'a>,
    /// l x K.
    pub v_low: TensorMut<'a>,
}

/// A layer's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlinearDims {
    /// N.
    pub out_features: i64,
    /// K.
    pub in_features: i64,
    /// r.
    pub frozen_rank: i64,
    /// l.
    pub trainable_rank: i64,
}

/// What a layer has done since it was created ([`FLinear::info`], library
/// 1.3.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlinearInfo {
    /// Rebuilds of the dense W from the trainable factors (the dense and
    /// hybrid strategies), kept or into scratch.
    pub rebuilds: u64,
    /// Builds of the frozen product (once, again after
    /// [`FLinear::refresh`] or [`FLinear::redecompose`]).
    pub frozen_builds: u64,
    /// Reports of a change of the trainable factors
    /// ([`FLinear::mark_updated`], views of trainable factors).
    pub trainable_version: u64,
    /// A rebuilt W is kept for the next call.
    pub weight_kept: bool,
}

/// Gradient outputs of [`FLinear::backward`]; `None` is not computed.
#[derive(Default)]
pub struct FlinearGrads<'a> {
    /// (..., K), x's dtype.
    pub grad_x: Option<TensorMut<'a>>,
    /// N x l.
    pub grad_u_low: Option<TensorMut<'a>>,
    /// l.
    pub grad_s_low: Option<TensorMut<'a>>,
    /// l x K.
    pub grad_v_low: Option<TensorMut<'a>>,
    /// N.
    pub grad_bias: Option<TensorMut<'a>>,
    /// OR of `FLinear::ACCUMULATE_*`: add instead of overwriting.
    pub accumulate: u32,
}

/// The factor gradients of a layer used as an MLP projection.
#[derive(Default)]
pub struct FactorGrads<'a> {
    /// N x l.
    pub grad_u_low: Option<TensorMut<'a>>,
    /// l.
    pub grad_s_low: Option<TensorMut<'a>>,
    /// l x K.
    pub grad_v_low: Option<TensorMut<'a>>,
    /// OR of `FLinear::ACCUMULATE_GRAD_{U,S,V}_LOW`.
    pub accumulate: u32,
}

pub(crate) struct RawGrads {
    pub(crate) d: [Option<sys::DLTensor>; 5],
    pub(crate) accumulate: u32,
}

impl RawGrads {
    pub(crate) fn of(g: &mut FactorGrads<'_>) -> RawGrads {
        RawGrads {
            d: [
                None,
                opt_dl_mut(g.grad_u_low.as_mut()),
                opt_dl_mut(g.grad_s_low.as_mut()),
                opt_dl_mut(g.grad_v_low.as_mut()),
                None,
            ],
            accumulate: g.accumulate,
        }
    }
    fn of_layer(g: &mut FlinearGrads<'_>) -> RawGrads {
        RawGrads {
            d: [
                opt_dl_mut(g.grad_x.as_mut()),
                opt_dl_mut(g.grad_u_low.as_mut()),
                opt_dl_mut(g.grad_s_low.as_mut()),
                opt_dl_mut(g.grad_v_low.as_mut()),
                opt_dl_mut(g.grad_bias.as_mut()),
            ],
            accumulate: g.accumulate,
        }
    }
    /// The C struct; it points into `self`.
    pub(crate) fn build(&mut self) -> sys::osft_flinear_grads_t {
        let [a, b, c, d, e] = &mut self.d;
        sys::osft_flinear_grads_t {
            struct_size: std::mem::size_of::<sys::osft_flinear_grads_t>(),
            grad_x: opt_ptr_mut(a),
            grad_u_low: opt_ptr_mut(b),
            grad_s_low: opt_ptr_mut(c),
            grad_v_low: opt_ptr_mut(d),
            grad_bias: opt_ptr_mut(e),
            accumulate: self.accumulate,
        }
    }
}

/// A factorized-linear (OSFT) layer on a context.
///
/// Made from a dense weight ([`from_weight`](Self::from_weight): the
/// library decomposes it and owns the factors) or over caller-owned factors
/// ([`from_factors`](Self::from_factors): borrowed mutably for the layer's
/// life). Factors are read and updated in place (an optimizer step) through
/// [`with_factor`](Self::with_factor) and
/// [`with_factor_mut`](Self::with_factor_mut).
///
/// ```
/// use osftrt::{Context, FLinear, Factor, FlinearGrads, Tensor, TensorMut};
/// let ctx = Context::cpu()?;
/// let (n, k) = (6, 4);
/// let w: Vec<f32> = (0..n * k).map(|i| ((i * 7 % 11) as f32 - 5.0) / 7.0).collect();
/// let layer = FLinear::from_weight(&ctx, &Tensor::new(&w, &[6, 4])?, &Default::default())?;
/// let x = [1.0f32, 2.0, 3.0, 4.0];
/// let mut y = [0.0f32; 6];
/// layer.forward(&Tensor::new(&x, &[1, 4])?, None, &mut TensorMut::new(&mut y, &[1, 6])?)?;
/// for i in 0..n {  // y = x W^T (up to fp32 rounding of the SVD)
///     let yi: f32 = (0..k).map(|j| w[i * k + j] * x[j]).sum();
///     assert!((y[i] - yi).abs() < 1e-4);
/// }
/// // One SGD step on the trainable singular values:
/// let mut gs = vec![0.0f32; layer.dims()?.trainable_rank as usize];
/// let gy = [1.0f32; 6];
/// layer.backward(&Tensor::new(&x, &[1, 4])?, &Tensor::new(&gy, &[1, 6])?,
///     &mut FlinearGrads { grad_s_low: Some(TensorMut::vector(&mut gs)), ..Default::default() })?;
/// layer.with_factor_mut(Factor::SLow, |mut s| {
///     for (s, g) in s.as_mut_slice::<f32>().unwrap().iter_mut().zip(&gs) { *s -= 0.1 * g; }
/// })?;
/// # Ok::<(), osftrt::Error>(())
/// ```
pub struct FLinear<'a> {
    raw: sys::osft_flinear_t,
    // 0: free; n > 0: n factor views lent out; -1: a factor lent mutably.
    borrow: Cell<isize>,
    _p: PhantomData<(&'a Context, &'a mut [u8])>,
}

/// A read-only view of one factor (inside [`FLinear::with_factor`]).
pub struct FactorRef<'l> {
    view: sys::DLTensor,
    _p: PhantomData<&'l [u8]>,
}

/// A writable view of one factor (inside [`FLinear::with_factor_mut`]).
pub struct FactorMut<'l> {
    view: sys::DLTensor,
    _p: PhantomData<&'l mut [u8]>,
}

fn view_shape(v: &sys::DLTensor) -> &[i64] {
    if v.ndim <= 0 || v.shape.is_null() {
        return &[];
    }
    // SAFETY: the layer's view arrays (ndim entries) stay valid while the
    // layer lives and is not re-decomposed, which the borrow state prevents
    // while a view exists.
    unsafe { std::slice::from_raw_parts(v.shape, v.ndim as usize) }
}

fn view_strides(v: &sys::DLTensor) -> Vec<i64> {
    let shape = view_shape(v);
    if v.strides.is_null() || shape.is_empty() {
        let mut s = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * shape[i + 1];
        }
        s
    } else {
        // SAFETY: as view_shape.
        unsafe { std::slice::from_raw_parts(v.strides, v.ndim as usize) }.to_vec()
    }
}

fn view_extent(v: &sys::DLTensor) -> usize {
    let shape = view_shape(v);
    if shape.contains(&0) || v.data.is_null() {
        return 0;
    }
    let strides = view_strides(v);
    1 + shape
        .iter()
        .zip(&strides)
        .map(|(&d, &s)| ((d - 1) * s) as usize)
        .sum::<usize>()
}

macro_rules! view_common {
    () => {
        /// The shape.
        pub fn shape(&self) -> &[i64] {
            view_shape(&self.view)
        }
        /// The strides in elements (padded rows: a row stride above the
        /// row length).
        pub fn strides(&self) -> Vec<i64> {
            view_strides(&self.view)
        }
        /// The dtype (`None`: one these bindings do not know).
        pub fn dtype(&self) -> Option<DType> {
            DType::from_dl(self.view.dtype)
        }
        /// The elements from the first to the last the view reaches, as a
        /// slice (`None` for another element type or device memory). With
        /// padded rows it includes the padding, which may belong to
        /// another factor: index it with [`strides`](Self::strides).
        pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
            if self.dtype() != Some(T::DTYPE) || self.view.device.device_type != sys::kDLCPU {
                return None;
            }
            let n = view_extent(&self.view);
            if n == 0 {
                return Some(&[]);
            }
            // SAFETY: the view describes host memory of the layer holding
            // n > 0 elements of T (dtype checked; data non-NULL, see
            // view_extent), which nothing writes while this view is borrowed.
            Some(unsafe { std::slice::from_raw_parts(self.view.data as *const T, n) })
        }
    };
}

impl FactorRef<'_> {
    view_common!();
}

impl FactorMut<'_> {
    view_common!();
    /// The data as a mutable slice, like [`as_slice`](Self::as_slice).
    pub fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        if self.dtype() != Some(T::DTYPE) || self.view.device.device_type != sys::kDLCPU {
            return None;
        }
        let n = view_extent(&self.view);
        if n == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in as_slice; the layer lent this factor exclusively
        // (borrow state -1) for the life of `self`.
        Some(unsafe { std::slice::from_raw_parts_mut(self.view.data as *mut T, n) })
    }
}

struct Restore<'c>(&'c Cell<isize>, isize);
impl Drop for Restore<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - self.1);
    }
}

fn busy() -> Error {
    Error::new(
        Status::InvalidArgument,
        "osftrt: the layer's factors are lent out (inside with_factor_mut, or a view is alive)",
    )
}

impl<'a> FLinear<'a> {
    /// Add into `grad_x`.
    pub const ACCUMULATE_GRAD_X: u32 = sys::OSFT_FLINEAR_ACCUMULATE_GRAD_X;
    /// Add into `grad_u_low`.
    pub const ACCUMULATE_GRAD_U_LOW: u32 = sys::OSFT_FLINEAR_ACCUMULATE_GRAD_U_LOW;
    /// Add into `grad_s_low`.
    pub const ACCUMULATE_GRAD_S_LOW: u32 = sys::OSFT_FLINEAR_ACCUMULATE_GRAD_S_LOW;
    /// Add into `grad_v_low`.
    pub const ACCUMULATE_GRAD_V_LOW: u32 = sys::OSFT_FLINEAR_ACCUMULATE_GRAD_V_LOW;
    /// Add into `grad_bias`.
    pub const ACCUMULATE_GRAD_BIAS: u32 = sys::OSFT_FLINEAR_ACCUMULATE_GRAD_BIAS;
    /// Add into every gradient.
    pub const ACCUMULATE_ALL: u32 = sys::OSFT_FLINEAR_ACCUMULATE_ALL;

    /// Decomposes a dense weight (N x K; f32, f64 or bf16) into
    /// runtime-owned factors (fp64 SVD).
    pub fn from_weight(
        ctx: &'a Context,
        weight: &Tensor<'_>,
        opts: &FlinearOptions,
    ) -> Result<FLinear<'a>> {
        let w = weight.dl();
        let o = opts.to_raw();
        let mut raw = ptr::null_mut();
        // SAFETY: a live context; `w` describes memory borrowed for the
        // call (the library copies the weight into its own factors).
        check(unsafe { sys::osft_flinear_create_from_weight(ctx.as_raw(), &w, &o, &mut raw) })?;
        Ok(FLinear {
            raw,
            borrow: Cell::new(0),
            _p: PhantomData,
        })
    }

    /// A layer over caller-owned factors, which it borrows mutably as long
    /// as it lives (it keeps their addresses).
    pub fn from_factors(
        ctx: &'a Context,
        factors: Factors<'a>,
        opts: &FlinearOptions,
    ) -> Result<FLinear<'a>> {
        let mut f = factors;
        let d = [
            f.u_high.dl(),
            f.s_high.dl(),
            f.v_high.dl(),
            f.u_low.dl(),
            f.s_low.dl(),
            f.v_low.dl(),
        ];
        let raw_f = sys::osft_flinear_factors_t {
            struct_size: std::mem::size_of::<sys::osft_flinear_factors_t>(),
            u_high: &d[0],
            s_high: &d[1],
            v_high: &d[2],
            u_low: &d[3],
            s_low: &d[4],
            v_low: &d[5],
        };
        let o = opts.to_raw();
        let mut raw = ptr::null_mut();
        // SAFETY: the descriptors are copied by the library; the memory
        // they describe is borrowed exclusively for 'a, which the layer
        // (and every use of it) cannot outlive.
        check(unsafe {
            sys::osft_flinear_create_from_factors(ctx.as_raw(), &raw_f, &o, &mut raw)
        })?;
        Ok(FLinear {
            raw,
            borrow: Cell::new(0),
            _p: PhantomData,
        })
    }

    /// The raw handle (owned by `self`).
    pub fn as_raw(&self) -> sys::osft_flinear_t {
        self.raw
    }

    /// Fails while a factor is lent mutably (the library would read it).
    pub(crate) fn check_readable(&self) -> Result<()> {
        if self.borrow.get() < 0 {
            Err(busy())
        } else {
            Ok(())
        }
    }

    /// Fails while any factor view is lent out (the library would write).
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.borrow.get() != 0 {
            Err(busy())
        } else {
            Ok(())
        }
    }

    /// N, K, r and l.
    pub fn dims(&self) -> Result<FlinearDims> {
        let mut d = FlinearDims {
            out_features: 0,
            in_features: 0,
            frozen_rank: 0,
            trainable_rank: 0,
        };
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe {
            sys::osft_flinear_get_dims(
                self.raw,
                &mut d.out_features,
                &mut d.in_features,
                &mut d.frozen_rank,
                &mut d.trainable_rank,
            )
        })?;
        Ok(d)
    }

    fn view(&self, which: Factor) -> Result<sys::DLTensor> {
        // SAFETY: all-zero is a valid DLTensor; the call fills it.
        let mut v: sys::DLTensor = unsafe { std::mem::zeroed() };
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::osft_flinear_get_factor(self.raw, which.raw(), &mut v) })?;
        Ok(v)
    }

    /// Runs `f` on a read-only view of one factor.
    pub fn with_factor<R>(&self, which: Factor, f: impl FnOnce(FactorRef<'_>) -> R) -> Result<R> {
        self.check_readable()?;
        let v = self.view(which)?;
        self.borrow.set(self.borrow.get() + 1);
        let _r = Restore(&self.borrow, 1);
        Ok(f(FactorRef {
            view: v,
            _p: PhantomData,
        }))
    }

    /// Runs `f` on a writable view of one factor (e.g. an optimizer step).
    /// Meanwhile every other use of the layer fails with
    /// [`Status::InvalidArgument`]; after a frozen factor changed, the
    /// layer's caches are refreshed.
    pub fn with_factor_mut<R>(
        &self,
        which: Factor,
        f: impl FnOnce(FactorMut<'_>) -> R,
    ) -> Result<R> {
        self.check_writable()?;
        let v = self.view(which)?;
        let r = {
            self.borrow.set(-1);
            let _r = Restore(&self.borrow, -1);
            f(FactorMut {
                view: v,
                _p: PhantomData,
            })
        };
        if which.frozen() {
            self.refresh()?;
        }
        Ok(r)
    }

    /// A copy of one factor's elements in row-major order (padding left
    /// out).
    pub fn factor_to_vec<T: Element>(&self, which: Factor) -> Result<Vec<T>> {
        self.with_factor(which, |v| {
            let data = v.as_slice::<T>().ok_or_else(|| {
                Error::new(
                    Status::DtypeMismatch,
                    format!("factor {which:?}: dtype {:?}", v.dtype()),
                )
            })?;
            let shape = v.shape().to_vec();
            let strides = v.strides();
            let mut out = Vec::new();
            match shape.len() {
                1 => out.extend((0..shape[0] as usize).map(|i| data[i * strides[0] as usize])),
                2 => {
                    for i in 0..shape[0] as usize {
                        for j in 0..shape[1] as usize {
                            out.push(data[i * strides[0] as usize + j * strides[1] as usize]);
                        }
                    }
                }
                n => {
                    return Err(Error::new(
                        Status::ShapeMismatch,
                        format!("factor of rank {n}"),
                    ))
                }
            }
            Ok(out)
        })?
    }

    /// Fixes the strategy of later calls ([`Strategy::Auto`]: cost model).
    pub fn set_strategy(&self, strategy: Strategy) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_flinear_set_strategy(self.raw, strategy.raw()) })
    }

    /// The strategy a pass over `tokens` rows would use.
    pub fn choose_strategy(&self, tokens: i64, pass: Pass) -> Result<Strategy> {
        let p = match pass {
            Pass::Forward => sys::OSFT_FLINEAR_FORWARD,
            Pass::Backward => sys::OSFT_FLINEAR_BACKWARD,
        };
        let mut s = 0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::osft_flinear_choose_strategy(self.raw, tokens, p, &mut s) })?;
        Ok(Strategy::from_raw(s))
    }

    /// `y = x W^T + bias`.
    pub fn forward(
        &self,
        x: &Tensor<'_>,
        bias: Option<&Tensor<'_>>,
        y: &mut TensorMut<'_>,
    ) -> Result<()> {
        self.check_readable()?;
        let (xd, bd, mut yd) = (x.dl(), opt_dl(bias), y.dl());
        // SAFETY: a live handle whose factors are not lent mutably; the
        // descriptors describe memory borrowed for the call (y exclusively).
        check(unsafe { sys::osft_flinear_forward(self.raw, &xd, opt_ptr(&bd), &mut yd) })
    }

    /// The backward for one forward: writes (or accumulates into) each
    /// requested gradient.
    pub fn backward(
        &self,
        x: &Tensor<'_>,
        grad_y: &Tensor<'_>,
        grads: &mut FlinearGrads<'_>,
    ) -> Result<()> {
        self.check_readable()?;
        let (xd, gd) = (x.dl(), grad_y.dl());
        let mut rg = RawGrads::of_layer(grads);
        let g = rg.build();
        // SAFETY: as in forward; the gradients are borrowed exclusively.
        check(unsafe { sys::osft_flinear_backward(self.raw, &xd, &gd, &g) })
    }

    /// Writes the dense weight `W` (N x K) into `weight`.
    pub fn merge(&self, weight: &mut TensorMut<'_>) -> Result<()> {
        self.check_readable()?;
        let mut w = weight.dl();
        // SAFETY: a live handle; `weight` is borrowed exclusively.
        check(unsafe { sys::osft_flinear_merge(self.raw, &mut w) })
    }

    /// Re-decomposes from `weight` (or the current merged weight), in
    /// place.
    pub fn redecompose(&self, weight: Option<&Tensor<'_>>) -> Result<()> {
        self.check_writable()?;
        let w = opt_dl(weight);
        // SAFETY: a live handle, no factor view alive (the factors are
        // overwritten); `weight` is only read.
        check(unsafe { sys::osft_flinear_redecompose(self.raw, opt_ptr(&w)) })
    }

    /// Drops what was cached from the frozen factors.
    pub fn refresh(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_flinear_refresh(self.raw) })
    }

    /// Reports that the trainable factors changed other than through the
    /// layer (an optimizer step on caller-owned factors): the kept dense W
    /// is rebuilt at the next call that needs it. Needed only with
    /// [`Updates::Reported`], harmless otherwise; cheap (no device work),
    /// once per optimizer step (library 1.3.0).
    pub fn mark_updated(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_flinear_mark_updated(self.raw) })
    }

    /// The layer's counters (library 1.3.0).
    pub fn info(&self) -> Result<FlinearInfo> {
        // SAFETY: all-zero is a valid osft_flinear_info_t; the library
        // fills it (osft_flinear_info_init's zeros and struct_size).
        let mut s: sys::osft_flinear_info_t = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of_val(&s);
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::osft_flinear_get_info(self.raw, &mut s) })?;
        Ok(FlinearInfo {
            rebuilds: s.rebuilds,
            frozen_builds: s.frozen_builds,
            trainable_version: s.trainable_version,
            weight_kept: s.weight_kept != 0,
        })
    }
}

impl Drop for FLinear<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and owned; anything registered with it
        // (MLPs, projectors) borrows the layer and was dropped before.
        let st = unsafe { sys::osft_flinear_destroy(self.raw) };
        debug_assert_eq!(st, sys::OSFT_STATUS_SUCCESS);
    }
}
