//! Fused linear cross-entropy: the LM-head loss and its gradients in one
//! call, with the logits never materialized (`osftrt/flce.h`).
use std::marker::PhantomData;
use std::ptr;

use osftrt_sys as sys;

use crate::comm::Comm;
use crate::context::Context;
use crate::error::{check, Result};
use crate::tensor::{opt_dl, opt_dl_mut, opt_ptr, opt_ptr_mut, Tensor, TensorMut};

/// How per-token losses are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// Sum over the tokens divided by their (class-weighted) count.
    Mean,
    /// Sum over the tokens.
    Sum,
    /// One loss per token.
    None,
}

/// Where `grad_weight` and `grad_bias` are summed over chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accumulator {
    /// An fp32 accumulator, rounded once (the default).
    Fp32,
    /// The gradient's own dtype (rounded per chunk for bf16).
    Output,
}

/// What a call chunks (see "The vocabulary plan" in `osftrt/flce.h`).
/// (Library 1.2.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Chunking {
    /// The planner picks the plan its cost model finds cheaper (the
    /// default). Never reported by [`Flce::plan`].
    Auto,
    /// Chunks of tokens over the whole vocabulary (three GEMMs, `grad_weight`
    /// summed over the chunks).
    Tokens,
    /// Tiles of tokens x vocabulary slices in two passes (four GEMMs' worth,
    /// `grad_weight` written once per token tile).
    Vocab,
}

impl Default for Chunking {
    /// [`Chunking::Auto`], the library's default.
    fn default() -> Self {
        Chunking::Auto
    }
}

impl Chunking {
    fn raw(self) -> sys::osft_flce_chunking_t {
        match self {
            Chunking::Auto => sys::OSFT_FLCE_CHUNKING_AUTO,
            Chunking::Tokens => sys::OSFT_FLCE_CHUNKING_TOKENS,
            Chunking::Vocab => sys::OSFT_FLCE_CHUNKING_VOCAB,
        }
    }

    fn from_raw(c: sys::osft_flce_chunking_t) -> Chunking {
        match c {
            sys::OSFT_FLCE_CHUNKING_TOKENS => Chunking::Tokens,
            sys::OSFT_FLCE_CHUNKING_VOCAB => Chunking::Vocab,
            _ => Chunking::Auto,
        }
    }
}

/// Options of a [`Flce`] handle; `Default` is the library's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct FlceOptions {
    /// Tokens with this target are ignored. Default -100.
    pub ignore_index: i64,
    /// Label smoothing in [0, 1]. Default 0.
    pub label_smoothing: f64,
    /// z-loss scale (adds `z_loss_scale * lse^2` per token). Default 0.
    pub z_loss_scale: f64,
    /// Logit softcap (0: off). Default 0.
    pub softcap: f64,
    /// Default [`Reduction::Mean`].
    pub reduction: Reduction,
    /// Default [`Accumulator::Fp32`].
    pub accumulator: Accumulator,
    /// Bound in bytes on a call's scratch (0: 1 GiB of chunk buffers).
    pub memory_budget: usize,
    /// At most this many tokens per chunk (0: as the budget allows).
    pub chunk_rows: i64,
    /// Vocab parallelism ([`Flce::with_comm`]): the first global class of
    /// this rank's shard of the weight. Default 0.
    pub vocab_offset: i64,
    /// Vocab parallelism: the global number of classes. Default 0.
    pub vocab_size_global: i64,
    /// Check the targets without waiting for the host: an out-of-range
    /// target then gives a NaN loss instead of an error, and
    /// [`Flce::check_targets`] reports it later. Default `false`. (1.1)
    pub device_target_check: bool,
    /// Token chunks or vocabulary slices; [`FlcePlan::chunking`] says which
    /// a call takes. Default [`Chunking::Auto`]. (1.2)
    pub chunking: Chunking,
    /// The vocabulary plan: at most this many classes per slice (0: as the
    /// budget allows, balanced over the slices). Default 0. (1.2)
    pub slice_cols: i64,
}

fn raw_options() -> sys::osft_flce_options_t {
    // SAFETY: all-zero is a valid osft_flce_options_t (numbers and a NULL
    // comm); the init call writes exactly the size it is given.
    unsafe {
        let mut o: sys::osft_flce_options_t = std::mem::zeroed();
        sys::osft_flce_options_init(&mut o, std::mem::size_of_val(&o));
        o
    }
}

impl Default for FlceOptions {
    fn default() -> Self {
        FlceOptions::from_raw(&raw_options())
    }
}

impl FlceOptions {
    fn from_raw(o: &sys::osft_flce_options_t) -> FlceOptions {
        FlceOptions {
            ignore_index: o.ignore_index,
            label_smoothing: o.label_smoothing,
            z_loss_scale: o.z_loss_scale,
            softcap: o.softcap,
            reduction: match o.reduction {
                sys::OSFT_FLCE_SUM => Reduction::Sum,
                sys::OSFT_FLCE_NONE => Reduction::None,
                _ => Reduction::Mean,
            },
            accumulator: match o.accumulator {
                sys::OSFT_FLCE_ACCUMULATOR_OUTPUT => Accumulator::Output,
                _ => Accumulator::Fp32,
            },
            memory_budget: o.memory_budget,
            chunk_rows: o.chunk_rows,
            vocab_offset: o.vocab_offset,
            vocab_size_global: o.vocab_size_global,
            device_target_check: o.device_target_check != 0,
            chunking: Chunking::from_raw(o.chunking),
            slice_cols: o.slice_cols,
        }
    }

    fn to_raw(&self, comm: sys::osft_comm_t) -> sys::osft_flce_options_t {
        let mut o = raw_options();
        o.ignore_index = self.ignore_index;
        o.label_smoothing = self.label_smoothing;
        o.z_loss_scale = self.z_loss_scale;
        o.softcap = self.softcap;
        o.reduction = match self.reduction {
            Reduction::Mean => sys::OSFT_FLCE_MEAN,
            Reduction::Sum => sys::OSFT_FLCE_SUM,
            Reduction::None => sys::OSFT_FLCE_NONE,
        };
        o.accumulator = match self.accumulator {
            Accumulator::Fp32 => sys::OSFT_FLCE_ACCUMULATOR_FP32,
            Accumulator::Output => sys::OSFT_FLCE_ACCUMULATOR_OUTPUT,
        };
        o.memory_budget = self.memory_budget;
        o.chunk_rows = self.chunk_rows;
        o.comm = comm;
        o.vocab_offset = self.vocab_offset;
        o.vocab_size_global = self.vocab_size_global;
        o.device_target_check = self.device_target_check as i32;
        o.chunking = self.chunking.raw();
        o.slice_cols = self.slice_cols;
        o
    }
}

/// The inputs of a call (see `osftrt/flce.h` for shapes and dtypes).
#[derive(Clone, Copy)]
pub struct FlceInputs<'a> {
    /// Hidden states (..., H), fp32 or bf16.
    pub x: Tensor<'a>,
    /// The LM head (V, H), x's dtype.
    pub weight: Tensor<'a>,
    /// Class targets, x's leading dims, i32 or i64.
    pub targets: Tensor<'a>,
    /// Optional bias (V).
    pub bias: Option<Tensor<'a>>,
    /// Optional class weights (V), fp32.
    pub class_weight: Option<Tensor<'a>>,
    /// Optional upstream gradient dL/dloss, fp32.
    pub grad_loss: Option<Tensor<'a>>,
}

impl<'a> FlceInputs<'a> {
    /// The required inputs; the optional ones are `None`.
    pub fn new(x: Tensor<'a>, weight: Tensor<'a>, targets: Tensor<'a>) -> FlceInputs<'a> {
        FlceInputs {
            x,
            weight,
            targets,
            bias: None,
            class_weight: None,
            grad_loss: None,
        }
    }
}

/// The outputs of a call; `None` is not computed, at least one must be
/// given. Without gradient outputs the call runs forward-only.
#[derive(Default)]
pub struct FlceOutputs<'a> {
    /// fp32 loss: one element (Mean, Sum) or one per token (None).
    pub loss: Option<TensorMut<'a>>,
    /// (..., H), x's dtype.
    pub grad_x: Option<TensorMut<'a>>,
    /// (V, H), fp32 or x's dtype.
    pub grad_weight: Option<TensorMut<'a>>,
    /// (V), fp32 or x's dtype.
    pub grad_bias: Option<TensorMut<'a>>,
    /// fp32, like the loss: the z-loss part.
    pub z_loss: Option<TensorMut<'a>>,
    /// fp32, one element: the argmax accuracy over non-ignored tokens.
    pub accuracy: Option<TensorMut<'a>>,
    /// i32 or i64 per token: the index of the largest logit.
    pub argmax: Option<TensorMut<'a>>,
    /// fp32 per token: the loss before reduction.
    pub token_loss: Option<TensorMut<'a>>,
    /// OR of [`Flce::ACCUMULATE_GRAD_X`], ...: add into the gradients
    /// instead of overwriting them.
    pub accumulate: u32,
}

/// What a call would do ([`Flce::plan`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlcePlan {
    /// Tokens M.
    pub tokens: i64,
    /// Tokens per chunk (per token tile with [`Chunking::Vocab`]).
    pub chunk_rows: i64,
    /// Number of chunks (token tiles with [`Chunking::Vocab`]).
    pub chunks: i64,
    /// Workspace bytes the call takes.
    pub scratch_bytes: u64,
    /// The bound it was planned against.
    pub budget_bytes: u64,
    /// The plan taken: [`Chunking::Tokens`] or [`Chunking::Vocab`], never
    /// [`Chunking::Auto`]. (1.2)
    pub chunking: Chunking,
    /// Vocabulary slices per token tile (1 for the token plan). (1.2)
    pub slices: i64,
    /// Classes per slice, the last may have fewer (V for the token plan).
    /// (1.2)
    pub slice_cols: i64,
}

/// A fused linear cross-entropy handle (the loss settings), on a context.
pub struct Flce<'a> {
    raw: sys::osft_flce_t,
    _ctx: PhantomData<&'a Context>,
}

struct RawIo {
    x: sys::DLTensor,
    w: sys::DLTensor,
    t: sys::DLTensor,
    bias: Option<sys::DLTensor>,
    cw: Option<sys::DLTensor>,
    gl: Option<sys::DLTensor>,
    outs: [Option<sys::DLTensor>; 8],
}

impl<'a> Flce<'a> {
    /// Add into `grad_x`.
    pub const ACCUMULATE_GRAD_X: u32 = sys::OSFT_FLCE_ACCUMULATE_GRAD_X;
    /// Add into `grad_weight`.
    pub const ACCUMULATE_GRAD_WEIGHT: u32 = sys::OSFT_FLCE_ACCUMULATE_GRAD_WEIGHT;
    /// Add into `grad_bias`.
    pub const ACCUMULATE_GRAD_BIAS: u32 = sys::OSFT_FLCE_ACCUMULATE_GRAD_BIAS;
    /// Add into every gradient.
    pub const ACCUMULATE_ALL: u32 = sys::OSFT_FLCE_ACCUMULATE_ALL;

    /// A handle on `ctx` without vocab parallelism.
    pub fn new(ctx: &'a Context, opts: &FlceOptions) -> Result<Flce<'a>> {
        Flce::create(ctx, ptr::null_mut(), opts)
    }

    /// A vocab-parallel handle: the weight is sharded over the ranks of
    /// `comm` (set `vocab_offset` and `vocab_size_global`). The
    /// communicator stays borrowed while the handle lives.
    pub fn with_comm(ctx: &'a Context, comm: &'a Comm<'a>, opts: &FlceOptions) -> Result<Flce<'a>> {
        Flce::create(ctx, comm.as_raw(), opts)
    }

    fn create(ctx: &'a Context, comm: sys::osft_comm_t, opts: &FlceOptions) -> Result<Flce<'a>> {
        let o = opts.to_raw(comm);
        let mut raw = ptr::null_mut();
        // SAFETY: a live context (borrowed for 'a), valid options and
        // out-pointer; the comm, if any, is borrowed for 'a as well.
        check(unsafe { sys::osft_flce_create(ctx.as_raw(), &o, &mut raw) })?;
        Ok(Flce {
            raw,
            _ctx: PhantomData,
        })
    }

    /// The options as the handle read them.
    pub fn options(&self) -> Result<FlceOptions> {
        let mut o = raw_options();
        // SAFETY: a live handle and a struct of struct_size bytes.
        check(unsafe { sys::osft_flce_get_options(self.raw, &mut o) })?;
        Ok(FlceOptions::from_raw(&o))
    }

    fn raw_io(inputs: &FlceInputs<'_>, outputs: &mut FlceOutputs<'_>) -> RawIo {
        RawIo {
            x: inputs.x.dl(),
            w: inputs.weight.dl(),
            t: inputs.targets.dl(),
            bias: opt_dl(inputs.bias.as_ref()),
            cw: opt_dl(inputs.class_weight.as_ref()),
            gl: opt_dl(inputs.grad_loss.as_ref()),
            outs: [
                opt_dl_mut(outputs.loss.as_mut()),
                opt_dl_mut(outputs.grad_x.as_mut()),
                opt_dl_mut(outputs.grad_weight.as_mut()),
                opt_dl_mut(outputs.grad_bias.as_mut()),
                opt_dl_mut(outputs.z_loss.as_mut()),
                opt_dl_mut(outputs.accuracy.as_mut()),
                opt_dl_mut(outputs.argmax.as_mut()),
                opt_dl_mut(outputs.token_loss.as_mut()),
            ],
        }
    }

    fn structs(
        r: &mut RawIo,
        accumulate: u32,
    ) -> (sys::osft_flce_inputs_t, sys::osft_flce_outputs_t) {
        let inp = sys::osft_flce_inputs_t {
            struct_size: std::mem::size_of::<sys::osft_flce_inputs_t>(),
            x: &r.x,
            weight: &r.w,
            targets: &r.t,
            bias: opt_ptr(&r.bias),
            class_weight: opt_ptr(&r.cw),
            grad_loss: opt_ptr(&r.gl),
        };
        let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut r.outs;
        let out = sys::osft_flce_outputs_t {
            struct_size: std::mem::size_of::<sys::osft_flce_outputs_t>(),
            loss: opt_ptr_mut(o0),
            grad_x: opt_ptr_mut(o1),
            grad_weight: opt_ptr_mut(o2),
            grad_bias: opt_ptr_mut(o3),
            z_loss: opt_ptr_mut(o4),
            accuracy: opt_ptr_mut(o5),
            argmax: opt_ptr_mut(o6),
            token_loss: opt_ptr_mut(o7),
            accumulate,
        };
        (inp, out)
    }

    /// Computes the loss and every requested output in one pass. On
    /// failure nothing is written (accumulated gradients included).
    pub fn compute(&self, inputs: &FlceInputs<'_>, outputs: &mut FlceOutputs<'_>) -> Result<()> {
        let mut r = Flce::raw_io(inputs, outputs);
        let (inp, out) = Flce::structs(&mut r, outputs.accumulate);
        // SAFETY: a live handle; every descriptor points at memory borrowed
        // by `inputs` (shared) or `outputs` (exclusive) for this call, with
        // shape/stride arrays inside those tensors, and the structs that
        // point at the descriptors live until the call returns.
        check(unsafe { sys::osft_flce_compute(self.raw, &inp, &out) })
    }

    /// Validates a call as [`compute`](Self::compute) would and describes it,
    /// without computing or writing anything.
    pub fn plan(&self, inputs: &FlceInputs<'_>, outputs: &mut FlceOutputs<'_>) -> Result<FlcePlan> {
        let mut r = Flce::raw_io(inputs, outputs);
        let (inp, out) = Flce::structs(&mut r, outputs.accumulate);
        // SAFETY: all-zero is a valid plan struct; struct_size set below.
        let mut p: sys::osft_flce_plan_t = unsafe { std::mem::zeroed() };
        p.struct_size = std::mem::size_of_val(&p);
        // SAFETY: as in compute; the plan call writes only `p`.
        check(unsafe { sys::osft_flce_get_plan(self.raw, &inp, &out, &mut p) })?;
        Ok(FlcePlan {
            tokens: p.tokens,
            chunk_rows: p.chunk_rows,
            chunks: p.chunks,
            scratch_bytes: p.scratch_bytes,
            budget_bytes: p.budget_bytes,
            chunking: Chunking::from_raw(p.chunking),
            slices: p.slices,
            slice_cols: p.slice_cols,
        })
    }

    /// Reports and clears the sticky target error of a handle made with
    /// `device_target_check`: `Err` with [`Status::IndexOutOfRange`](crate::Status::IndexOutOfRange)
    /// (the message names the call, token and target) if a call since the
    /// last check had a target outside [0, V). Always `Ok` without the
    /// option (calls fail at once instead). On CUDA it waits for the stream.
    pub fn check_targets(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_flce_check_targets(self.raw) })
    }

    /// The raw handle (owned by `self`).
    pub fn as_raw(&self) -> sys::osft_flce_t {
        self.raw
    }
}

impl Drop for Flce<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and owned; destroyed exactly once.
        let st = unsafe { sys::osft_flce_destroy(self.raw) };
        debug_assert_eq!(st, sys::OSFT_STATUS_SUCCESS);
    }
}
