//! OSFT gradient projection: keeps the trainable factors' gradients (and
//! the factors) out of the frozen subspace, over any sharding, with one
//! collective per step (`osftrt/projection.h`).
use std::marker::PhantomData;
use std::ptr;

use osftrt_sys as sys;

use crate::comm::Comm;
use crate::context::Context;
use crate::error::{check, Error, Result, Status};
use crate::flinear::FLinear;
use crate::tensor::{opt_dl_mut, opt_ptr, Tensor, TensorMut};

/// How one part (U or V) of a target is spread over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardLayout {
    /// Every rank holds the whole part.
    Replicated,
    /// U only: rows (N) sharded.
    URows,
    /// V only: rows of V_high (r) and of V_low (l) sharded.
    VRows,
    /// V only: columns (K) sharded.
    VCols,
}

impl ShardLayout {
    fn raw(self) -> sys::osft_shard_layout_t {
        match self {
            ShardLayout::Replicated => sys::OSFT_SHARD_REPLICATED,
            ShardLayout::URows => sys::OSFT_SHARD_U_ROWS,
            ShardLayout::VRows => sys::OSFT_SHARD_V_ROWS,
            ShardLayout::VCols => sys::OSFT_SHARD_V_COLS,
        }
    }
}

/// The arithmetic of the update `x -= U_high C` (or `x -= C V_high`), `x`
/// a gradient or a trainable factor; `C` is always accumulated in fp32.
/// (Library 1.2.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// Follows `x`'s dtype: fp32 gets the exact update; bf16 one bf16 GEMM
    /// where bf16 GEMMs are native (CUDA, oneMKL), else fp32. The default.
    Auto,
    /// `C` to about fp32 accuracy (two bf16 GEMMs against `C` split into
    /// bf16 halves where bf16 GEMMs are native, else one fp32 GEMM).
    Exact,
    /// One fp32 GEMM (TF32 on CUDA when the context allows TF32).
    Fp32,
    /// One bf16 GEMM against `C` rounded to bf16; parts with fp32
    /// `U_high` / `V_high` use [`Arithmetic::Fp32`].
    Bf16,
}

impl Arithmetic {
    fn raw(self) -> sys::osft_projection_arithmetic_t {
        match self {
            Arithmetic::Auto => sys::OSFT_PROJECTION_ARITHMETIC_AUTO,
            Arithmetic::Exact => sys::OSFT_PROJECTION_ARITHMETIC_EXACT,
            Arithmetic::Fp32 => sys::OSFT_PROJECTION_ARITHMETIC_FP32,
            Arithmetic::Bf16 => sys::OSFT_PROJECTION_ARITHMETIC_BF16,
        }
    }

    fn from_raw(a: sys::osft_projection_arithmetic_t) -> Arithmetic {
        match a {
            sys::OSFT_PROJECTION_ARITHMETIC_EXACT => Arithmetic::Exact,
            sys::OSFT_PROJECTION_ARITHMETIC_FP32 => Arithmetic::Fp32,
            sys::OSFT_PROJECTION_ARITHMETIC_BF16 => Arithmetic::Bf16,
            _ => Arithmetic::Auto,
        }
    }
}

/// Options of a projector; `Default` is the library's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectorOptions {
    /// Check at setup that every rank registered the same targets.
    pub check_consistency: bool,
    /// The update's arithmetic for every target. Default
    /// [`Arithmetic::Auto`]. (Library 1.2.)
    pub arithmetic: Arithmetic,
}

impl Default for ProjectorOptions {
    fn default() -> Self {
        let o = raw_options();
        ProjectorOptions {
            check_consistency: o.check_consistency != 0,
            arithmetic: Arithmetic::from_raw(o.arithmetic),
        }
    }
}

fn raw_options() -> sys::osft_projector_options_t {
    // SAFETY: all-zero is a valid options struct; init writes exactly the
    // size it is given.
    unsafe {
        let mut o: sys::osft_projector_options_t = std::mem::zeroed();
        sys::osft_projector_options_init(&mut o, std::mem::size_of_val(&o));
        o
    }
}

/// One part (U or V) of a framework-owned target, as this rank holds it.
pub struct PartTarget<'a> {
    /// The frozen factor (U_high N x r, or V_high r x K), only read.
    pub high: Tensor<'a>,
    /// The trainable factor (U_low N x l, or V_low l x K), projected in
    /// place by [`Projector::project_params`].
    pub low: TensorMut<'a>,
    /// How the part is sharded.
    pub layout: ShardLayout,
    /// Each rank's local size (empty for [`ShardLayout::Replicated`]).
    pub shards: Vec<i64>,
}

/// A framework-owned target: a U part, a V part, or both. The projector
/// borrows the factors for its whole life; gradients are passed per call
/// ([`Projector::project`]).
pub struct Target<'a> {
    /// The U part.
    pub u: Option<PartTarget<'a>>,
    /// The V part.
    pub v: Option<PartTarget<'a>>,
}

/// The gradients of one registered target for one [`Projector::project`]
/// call (`None`: that part's gradient is not projected).
pub struct ProjectionGrads<'g> {
    /// The index [`Projector::add_layer`] / [`Projector::add_target`] gave.
    pub target: usize,
    /// dL/dU_low.
    pub grad_u_low: Option<TensorMut<'g>>,
    /// dL/dV_low.
    pub grad_v_low: Option<TensorMut<'g>>,
}

/// What a projector holds and does per call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProjectorInfo {
    /// Registered targets.
    pub targets: i64,
    /// fp32 coefficients all-reduced per call.
    pub reduced_elements: i64,
    /// 0 or 1.
    pub collectives_per_project: i64,
    /// Bytes of the persistent coefficient buffer.
    pub coefficient_bytes: u64,
    /// Bytes of the cached V_high of V_ROWS targets.
    pub gathered_bytes: u64,
    /// Whether the next call runs the setup collectives.
    pub setup_pending: bool,
    /// GEMMs computed by the last [`Projector::project`] or
    /// [`Projector::project_params`] call (0 before the first). (Library 1.2.)
    pub last_gemms: i64,
    /// Backend GEMM calls of the last call: targets with the same shapes,
    /// dtypes and arithmetic share one batched call, so this is at most
    /// `last_gemms`. (Library 1.2.)
    pub last_gemm_calls: i64,
    /// Conversions, splits and adds of the last call. (Library 1.2.)
    pub last_elementwise_calls: i64,
    /// Collectives the last call launched (its setup included). (Library 1.2.)
    pub last_collectives: i64,
    /// Times the last call waited for the device (0 on the steady path).
    /// (Library 1.2.)
    pub last_host_waits: i64,
}

enum Registered<'a> {
    Layer(&'a FLinear<'a>),
    Target(Box<Target<'a>>),
}

/// A gradient projector: targets registered once, projected every step.
///
/// ```
/// use osftrt::{Context, FLinear, Projector, ProjectionGrads, Tensor, TensorMut};
/// let ctx = Context::cpu()?;
/// let w: Vec<f32> = (0..48).map(|i| ((i * 5 % 13) as f32 - 6.0) / 5.0).collect();
/// let layer = FLinear::from_weight(&ctx, &Tensor::new(&w, &[8, 6])?, &Default::default())?;
/// let d = layer.dims()?;
/// let mut p = Projector::new(&ctx, None, &Default::default())?;
/// let t = p.add_layer(&layer)?;
/// let mut gu = vec![1.0f32; (d.out_features * d.trainable_rank) as usize];
/// p.project(&mut [ProjectionGrads { target: t,
///     grad_u_low: Some(TensorMut::new(&mut gu, &[d.out_features, d.trainable_rank])?),
///     grad_v_low: None }])?;
/// let (max_u, max_v) = p.orthogonality()?;
/// assert!(max_u < 1e-5 && max_v < 1e-5);
/// # Ok::<(), osftrt::Error>(())
/// ```
pub struct Projector<'a> {
    raw: sys::osft_projector_t,
    registered: Vec<Registered<'a>>,
    _p: PhantomData<(&'a Context, &'a Comm<'a>)>,
}

impl<'a> Projector<'a> {
    /// A projector on `ctx` whose collectives run on `comm` (`None`: one
    /// rank).
    pub fn new(
        ctx: &'a Context,
        comm: Option<&'a Comm<'a>>,
        opts: &ProjectorOptions,
    ) -> Result<Projector<'a>> {
        let mut o = raw_options();
        o.check_consistency = opts.check_consistency as i32;
        o.arithmetic = opts.arithmetic.raw();
        let mut raw = ptr::null_mut();
        // SAFETY: a live context and communicator (borrowed for 'a), valid
        // options and out-pointer.
        check(unsafe {
            sys::osft_projector_create(
                ctx.as_raw(),
                comm.map_or(ptr::null_mut(), |c| c.as_raw()),
                &o,
                &mut raw,
            )
        })?;
        Ok(Projector {
            raw,
            registered: Vec::new(),
            _p: PhantomData,
        })
    }

    /// Registers a layer (replicated); its factors are read through the
    /// layer at every call. Returns the target's index.
    pub fn add_layer(&mut self, layer: &'a FLinear<'a>) -> Result<usize> {
        let mut index = 0;
        // SAFETY: live handles; the layer is borrowed for 'a, so it outlives
        // the projector. No gradients are bound between calls.
        check(unsafe {
            sys::osft_projector_add_layer(
                self.raw,
                layer.as_raw(),
                ptr::null(),
                ptr::null(),
                &mut index,
            )
        })?;
        self.registered.push(Registered::Layer(layer));
        Ok(index as usize)
    }

    /// Registers a framework-owned target. Returns its index.
    pub fn add_target(&mut self, mut target: Target<'a>) -> Result<usize> {
        if target.u.is_none() && target.v.is_none() {
            return Err(Error::new(
                Status::InvalidArgument,
                "projector: a target with neither a U nor a V part",
            ));
        }
        let dl = |p: &mut Option<PartTarget<'a>>| {
            p.as_mut().map(|p| {
                (
                    p.high.dl(),
                    p.low.dl(),
                    p.layout.raw(),
                    p.shards.as_ptr(),
                    p.shards.len(),
                )
            })
        };
        let (u, v) = (dl(&mut target.u), dl(&mut target.v));
        let raw_t = sys::osft_projection_target_t {
            struct_size: std::mem::size_of::<sys::osft_projection_target_t>(),
            u_high: u.as_ref().map_or(ptr::null(), |p| &p.0),
            grad_u_low: ptr::null(),
            u_low: u.as_ref().map_or(ptr::null(), |p| &p.1),
            u_layout: u.as_ref().map_or(sys::OSFT_SHARD_REPLICATED, |p| p.2),
            u_shards: u
                .as_ref()
                .map_or(ptr::null(), |p| if p.4 == 0 { ptr::null() } else { p.3 }),
            n_u_shards: u.as_ref().map_or(0, |p| p.4 as i64),
            v_high: v.as_ref().map_or(ptr::null(), |p| &p.0),
            grad_v_low: ptr::null(),
            v_low: v.as_ref().map_or(ptr::null(), |p| &p.1),
            v_layout: v.as_ref().map_or(sys::OSFT_SHARD_REPLICATED, |p| p.2),
            v_shards: v
                .as_ref()
                .map_or(ptr::null(), |p| if p.4 == 0 { ptr::null() } else { p.3 }),
            n_v_shards: v.as_ref().map_or(0, |p| p.4 as i64),
        };
        let mut index = 0;
        // SAFETY: a live handle; the descriptors are copied; the factor
        // memory is borrowed for 'a (kept in `self.registered`), and so are
        // the shard arrays (heap buffers that do not move with the Vec).
        check(unsafe { sys::osft_projector_add_target(self.raw, &raw_t, &mut index) })?;
        self.registered.push(Registered::Target(Box::new(target)));
        Ok(index as usize)
    }

    /// Views of a framework-owned target's trainable factors (U_low,
    /// V_low), e.g. for an optimizer step. `None` for a layer target or an
    /// unknown index.
    pub fn trainable_mut(
        &mut self,
        index: usize,
    ) -> Option<(Option<TensorMut<'_>>, Option<TensorMut<'_>>)> {
        match self.registered.get_mut(index)? {
            Registered::Target(t) => Some((
                t.u.as_mut().map(|p| p.low.reborrow()),
                t.v.as_mut().map(|p| p.low.reborrow()),
            )),
            Registered::Layer(_) => None,
        }
    }

    fn check_layers(&self, write: bool) -> Result<()> {
        for r in &self.registered {
            if let Registered::Layer(l) = r {
                if write {
                    l.check_writable()?;
                } else {
                    l.check_readable()?;
                }
            }
        }
        Ok(())
    }

    fn bind(&self, index: usize, gu: *const sys::DLTensor, gv: *const sys::DLTensor) -> Result<()> {
        // SAFETY: a live handle; the gradients are NULL or descriptors of
        // memory borrowed by the caller of `project` for that call, and
        // are unbound (NULL) again before `project` returns.
        check(unsafe { sys::osft_projector_set_grads(self.raw, index as i64, gu, gv) })
    }

    /// Projects the given gradients out of their targets' frozen
    /// subspaces, in place (collective: at most one all-reduce). On failure
    /// no gradient is modified.
    pub fn project(&mut self, grads: &mut [ProjectionGrads<'_>]) -> Result<()> {
        self.check_layers(false)?;
        let n = self.registered.len();
        let mut seen = vec![false; n];
        for g in grads.iter() {
            if g.target >= n || std::mem::replace(&mut seen[g.target], true) {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!(
                        "projector: target {} unknown or given twice ({n} registered)",
                        g.target
                    ),
                ));
            }
        }
        let descs: Vec<(Option<sys::DLTensor>, Option<sys::DLTensor>)> = grads
            .iter_mut()
            .map(|g| {
                (
                    opt_dl_mut(g.grad_u_low.as_mut()),
                    opt_dl_mut(g.grad_v_low.as_mut()),
                )
            })
            .collect();
        let mut bound = 0;
        let mut result = Ok(());
        for (g, (u, v)) in grads.iter().zip(descs.iter()) {
            if let Err(e) = self.bind(g.target, opt_ptr(u), opt_ptr(v)) {
                result = Err(e);
                break;
            }
            bound += 1;
        }
        if result.is_ok() {
            // SAFETY: a live handle; every bound gradient is borrowed by
            // `grads` for this call.
            result = check(unsafe { sys::osft_projector_project(self.raw) });
        }
        for g in grads.iter().take(bound) {
            // Unbinding cannot fail for a registered target with its
            // trainable factors (layers and, by construction, every
            // framework target), so no pointer to `grads` survives.
            let st = self.bind(g.target, ptr::null(), ptr::null());
            debug_assert!(st.is_ok());
        }
        result
    }

    /// Projects the trainable factors themselves (after an optimizer step).
    pub fn project_params(&mut self) -> Result<()> {
        self.check_layers(true)?;
        // SAFETY: a live handle; the factors are borrowed by the projector
        // (targets) or not lent out by their layers (checked above).
        check(unsafe { sys::osft_projector_project_params(self.raw) })
    }

    /// `(max |U_high^T U_low|, max |V_low V_high^T|)` over all targets and
    /// ranks (collective).
    pub fn orthogonality(&self) -> Result<(f64, f64)> {
        self.check_layers(false)?;
        let (mut u, mut v) = (0.0, 0.0);
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe { sys::osft_projector_orthogonality(self.raw, &mut u, &mut v) })?;
        Ok((u, v))
    }

    /// Runs the pending one-time setup collectives now.
    pub fn prepare(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_projector_prepare(self.raw) })
    }

    /// The frozen factors changed: the gathered V_high is dropped.
    pub fn invalidate(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_projector_invalidate(self.raw) })
    }

    /// What the projector holds and does per call.
    pub fn info(&self) -> Result<ProjectorInfo> {
        // SAFETY: all-zero is a valid info struct.
        let mut i: sys::osft_projector_info_t = unsafe { std::mem::zeroed() };
        i.struct_size = std::mem::size_of_val(&i);
        // SAFETY: a live handle; a struct of struct_size bytes.
        check(unsafe { sys::osft_projector_get_info(self.raw, &mut i) })?;
        Ok(ProjectorInfo {
            targets: i.targets,
            reduced_elements: i.reduced_elements,
            collectives_per_project: i.collectives_per_project,
            coefficient_bytes: i.coefficient_bytes,
            gathered_bytes: i.gathered_bytes,
            setup_pending: i.setup_pending != 0,
            last_gemms: i.last_gemms,
            last_gemm_calls: i.last_gemm_calls,
            last_elementwise_calls: i.last_elementwise_calls,
            last_collectives: i.last_collectives,
            last_host_waits: i.last_host_waits,
        })
    }
}

impl Drop for Projector<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and owned.
        let st = unsafe { sys::osft_projector_destroy(self.raw) };
        debug_assert_eq!(st, sys::OSFT_STATUS_SUCCESS);
    }
}
