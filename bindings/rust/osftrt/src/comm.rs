//! Communicators: all-reduce, all-gather and barrier over the ranks that
//! train one model (`osftrt/comm.h`).
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use osftrt_sys as sys;

use crate::context::Context;
use crate::error::{check, Error, Result, Status};
use crate::tensor::{Bf16, DType, Tensor, TensorMut};

/// The engine behind a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// One rank.
    SelfRank,
    /// MPI (CPU contexts).
    Mpi,
    /// NCCL (CUDA contexts).
    Nccl,
    /// A framework's callbacks ([`CommCallbacks`]).
    Callbacks,
    /// A value these bindings do not know.
    Unknown(u32),
}

/// Options of every communicator; `Default` is the library's (300 s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommOptions {
    /// Seconds one collective may take (`f64::INFINITY`: no limit).
    pub timeout_seconds: f64,
}

fn raw_options(o: &CommOptions) -> sys::osft_comm_options_t {
    // SAFETY: all-zero is a valid osft_comm_options_t; the init call
    // writes exactly the size it is given.
    let mut r: sys::osft_comm_options_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { sys::osft_comm_options_init(&mut r, std::mem::size_of_val(&r)) };
    r.timeout_seconds = o.timeout_seconds;
    r
}

impl Default for CommOptions {
    fn default() -> Self {
        // SAFETY: as in raw_options.
        let mut r: sys::osft_comm_options_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { sys::osft_comm_options_init(&mut r, std::mem::size_of_val(&r)) };
        CommOptions {
            timeout_seconds: r.timeout_seconds,
        }
    }
}

/// This rank, the number of ranks and the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommInfo {
    /// This rank.
    pub rank: i32,
    /// The number of ranks.
    pub size: i32,
    /// The engine.
    pub engine: Engine,
}

/// Collectives a communicator made since creation or the last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommStats {
    /// All-reduce launches.
    pub allreduce_calls: u64,
    /// All-gather launches.
    pub allgather_calls: u64,
    /// Barriers.
    pub barrier_calls: u64,
    /// Bytes of all-reduced buffers.
    pub allreduce_bytes: u64,
    /// Bytes this rank contributed to all-gathers.
    pub allgather_bytes: u64,
    /// Collectives that failed or timed out.
    pub failures: u64,
}

/// An NCCL unique id (made on one rank, sent to the others).
#[derive(Clone, Copy)]
pub struct NcclUniqueId(pub [u8; 128]);

impl NcclUniqueId {
    /// A new id (`ncclGetUniqueId`); [`Status::NotSupported`] without NCCL.
    pub fn new() -> Result<NcclUniqueId> {
        // SAFETY: all-zero is a valid id struct (a char array).
        let mut id: sys::osft_nccl_unique_id_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer.
        check(unsafe { sys::osft_comm_nccl_unique_id(&mut id) })?;
        let mut b = [0u8; 128];
        for (d, s) in b.iter_mut().zip(id.internal.iter()) {
            *d = *s as u8;
        }
        Ok(NcclUniqueId(b))
    }
}

/// A buffer handed to a [`CommCallbacks`] collective.
pub enum CommBuf<'a> {
    /// fp32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements.
    Bf16(&'a mut [Bf16]),
}

/// A read-only buffer handed to a [`CommCallbacks`] all-gather.
pub enum CommSlice<'a> {
    /// fp32 elements.
    F32(&'a [f32]),
    /// bf16 elements.
    Bf16(&'a [Bf16]),
}

/// A framework's collectives (`osft_comm_callbacks_t`), for
/// [`Comm::with_callbacks`]. They run on the thread that called the library,
/// on host buffers (CPU contexts), and must not call into libosftrt with the
/// communicator's context (the C rule). Return `Err` with [`Status::Timeout`] to
/// report a timeout; any other error becomes [`Status::CommError`]. A panic
/// is caught and reported as a communication error.
pub trait CommCallbacks {
    /// Sums `buf` over all ranks, in place.
    fn allreduce_sum(&mut self, buf: CommBuf<'_>) -> Result<()>;
    /// Concatenates `counts[p]` elements from every rank p, in rank order,
    /// into `recv`; this rank's `send` holds `counts[rank]` elements.
    fn allgather(&mut self, send: CommSlice<'_>, recv: CommBuf<'_>, counts: &[i64]) -> Result<()>;
    /// Returns when every rank has entered it. The default all-reduces one
    /// element (what the library does without a barrier callback).
    fn barrier(&mut self) -> Result<()> {
        let mut one = [0.0f32];
        self.allreduce_sum(CommBuf::F32(&mut one))
    }
}

type CbBox<'a> = Box<dyn CommCallbacks + 'a>;

/// Makes a slice view of a callback's tensor: compact 1-D, fp32 or bf16.
///
/// # Safety
/// `t` is a tensor the library passed to a callback, valid for the call.
unsafe fn buf_len(t: &sys::DLTensor) -> Option<(DType, usize)> {
    let d = DType::from_dl(t.dtype)?;
    if t.ndim <= 0 || t.shape.is_null() {
        return Some((d, if t.ndim == 0 { 1 } else { 0 }));
    }
    // SAFETY: the library passes ndim entries of shape (caller's contract).
    let shape = unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) };
    Some((d, shape.iter().product::<i64>().max(0) as usize))
}

/// A slice of `n` elements at `p`; empty (without touching `p`, which may
/// be NULL) when `n` is 0.
///
/// # Safety
/// For `n > 0`, `p` points to `n` initialized elements valid for `'b`.
unsafe fn slice_of<'b, T>(p: *const T, n: usize) -> &'b [T] {
    if n == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// The mutable counterpart of [`slice_of`].
///
/// # Safety
/// For `n > 0`, `p` points to `n` elements valid for reads and writes, and
/// not otherwise accessed, for `'b`.
unsafe fn slice_of_mut<'b, T>(p: *mut T, n: usize) -> &'b mut [T] {
    if n == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
}

fn status_of(r: std::thread::Result<Result<()>>) -> sys::osft_status_t {
    match r {
        Ok(Ok(())) => sys::OSFT_STATUS_SUCCESS,
        Ok(Err(e)) if e.status() == Status::Timeout => sys::OSFT_STATUS_TIMEOUT,
        _ => sys::OSFT_STATUS_COMM_ERROR,
    }
}

unsafe extern "C" fn cb_allreduce(
    user: *mut c_void,
    buf: *mut sys::DLTensor,
) -> sys::osft_status_t {
    // SAFETY: `user` is the CbBox owned by the Comm, alive until after
    // osft_comm_destroy; the library calls one callback at a time, from the
    // thread that uses the communicator, so this is the only reference.
    let cb = unsafe { &mut *(user as *mut CbBox<'_>) };
    // SAFETY: `buf` is a valid compact tensor for the call (comm.h).
    let t = unsafe { &*buf };
    // SAFETY: as above.
    let (d, n) = match unsafe { buf_len(t) } {
        Some(x) => x,
        None => return sys::OSFT_STATUS_COMM_ERROR,
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match d {
        DType::F32 => {
            // SAFETY: host memory of n elements of the dtype, exclusive for
            // the duration of the callback.
            let buf = unsafe { slice_of_mut(t.data as *mut f32, n) };
            cb.allreduce_sum(CommBuf::F32(buf))
        }
        DType::Bf16 => {
            // SAFETY: as above.
            let buf = unsafe { slice_of_mut(t.data as *mut Bf16, n) };
            cb.allreduce_sum(CommBuf::Bf16(buf))
        }
        _ => Err(Error::new(Status::DtypeMismatch, "callback buffer dtype")),
    }));
    status_of(r)
}

unsafe extern "C" fn cb_allgather(
    user: *mut c_void,
    send: *const sys::DLTensor,
    recv: *mut sys::DLTensor,
    counts: *const i64,
    n_counts: i64,
) -> sys::osft_status_t {
    // SAFETY: as in cb_allreduce.
    let cb = unsafe { &mut *(user as *mut CbBox<'_>) };
    // SAFETY: valid tensors and `n_counts` counts for the call (comm.h).
    let (s, r, counts) = unsafe { (&*send, &*recv, slice_of(counts, n_counts.max(0) as usize)) };
    // SAFETY: as above.
    let ((ds, ns), (dr, nr)) = match (unsafe { buf_len(s) }, unsafe { buf_len(r) }) {
        (Some(a), Some(b)) => (a, b),
        _ => return sys::OSFT_STATUS_COMM_ERROR,
    };
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match (ds, dr) {
        (DType::F32, DType::F32) => {
            // SAFETY: host memory of ns / nr elements, send and recv
            // disjoint (the library checks), exclusive for the callback.
            let (send, recv) = unsafe {
                (
                    slice_of(s.data as *const f32, ns),
                    slice_of_mut(r.data as *mut f32, nr),
                )
            };
            cb.allgather(CommSlice::F32(send), CommBuf::F32(recv), counts)
        }
        (DType::Bf16, DType::Bf16) => {
            // SAFETY: as above.
            let (send, recv) = unsafe {
                (
                    slice_of(s.data as *const Bf16, ns),
                    slice_of_mut(r.data as *mut Bf16, nr),
                )
            };
            cb.allgather(CommSlice::Bf16(send), CommBuf::Bf16(recv), counts)
        }
        _ => Err(Error::new(Status::DtypeMismatch, "callback buffer dtype")),
    }));
    status_of(res)
}

unsafe extern "C" fn cb_barrier(user: *mut c_void) -> sys::osft_status_t {
    // SAFETY: as in cb_allreduce.
    let cb = unsafe { &mut *(user as *mut CbBox<'_>) };
    status_of(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
        || cb.barrier(),
    )))
}

/// A communicator on a context.
///
/// ```
/// use osftrt::{Comm, Context, TensorMut};
/// let ctx = Context::cpu()?;
/// let comm = Comm::new_self(&ctx, &Default::default())?;   // one rank
/// let mut g = [1.0f32, 2.0, 3.0];
/// comm.allreduce_sum(&mut TensorMut::vector(&mut g))?;    // sum over one rank
/// assert_eq!(g, [1.0, 2.0, 3.0]);
/// assert_eq!(comm.stats()?.allreduce_calls, 1);
/// # Ok::<(), osftrt::Error>(())
/// ```
pub struct Comm<'a> {
    raw: sys::osft_comm_t,
    // The callbacks' `user`, freed after osft_comm_destroy.
    callbacks: Option<Box<CbBox<'a>>>,
    _ctx: PhantomData<&'a Context>,
}

impl<'a> Comm<'a> {
    /// The one-rank communicator.
    pub fn new_self(ctx: &'a Context, opts: &CommOptions) -> Result<Comm<'a>> {
        let o = raw_options(opts);
        let mut raw = ptr::null_mut();
        // SAFETY: a live context, valid options and out-pointer.
        check(unsafe { sys::osft_comm_create_self(ctx.as_raw(), &o, &mut raw) })?;
        Ok(Comm {
            raw,
            callbacks: None,
            _ctx: PhantomData,
        })
    }

    /// Wraps an MPI communicator given by its Fortran handle
    /// (`MPI_Comm_c2f(comm)`), for a CPU context; collective. MPI must be
    /// initialized by the caller (else [`Status::InvalidArgument`]);
    /// [`Status::NotSupported`] for a library built without MPI.
    pub fn from_mpi(ctx: &'a Context, fortran_handle: i64, opts: &CommOptions) -> Result<Comm<'a>> {
        let o = raw_options(opts);
        let mut raw = ptr::null_mut();
        // SAFETY: a live context; the library validates the MPI state and
        // the handle before using it.
        check(unsafe { sys::osft_comm_create_mpi(ctx.as_raw(), fortran_handle, &o, &mut raw) })?;
        Ok(Comm {
            raw,
            callbacks: None,
            _ctx: PhantomData,
        })
    }

    /// Wraps the caller's NCCL communicator (an `ncclComm_t`).
    ///
    /// # Safety
    /// `nccl_comm` must be a live NCCL communicator on the context's device
    /// that outlives the returned `Comm`.
    pub unsafe fn from_nccl(
        ctx: &'a Context,
        nccl_comm: *mut c_void,
        opts: &CommOptions,
    ) -> Result<Comm<'a>> {
        let o = raw_options(opts);
        let mut raw = ptr::null_mut();
        // SAFETY: the caller vouches for nccl_comm; the context is live.
        check(unsafe { sys::osft_comm_create_nccl(ctx.as_raw(), nccl_comm, &o, &mut raw) })?;
        Ok(Comm {
            raw,
            callbacks: None,
            _ctx: PhantomData,
        })
    }

    /// Creates an NCCL communicator of `nranks` ranks from `id`
    /// (collective), owned by the returned `Comm`.
    pub fn nccl_from_id(
        ctx: &'a Context,
        id: &NcclUniqueId,
        nranks: i32,
        rank: i32,
        opts: &CommOptions,
    ) -> Result<Comm<'a>> {
        // SAFETY: all-zero is a valid id struct.
        let mut rid: sys::osft_nccl_unique_id_t = unsafe { std::mem::zeroed() };
        for (d, s) in rid.internal.iter_mut().zip(id.0.iter()) {
            *d = *s as _;
        }
        let o = raw_options(opts);
        let mut raw = ptr::null_mut();
        // SAFETY: a live context; `rid` and `o` are valid for the call.
        check(unsafe {
            sys::osft_comm_create_nccl_from_id(ctx.as_raw(), &rid, nranks, rank, &o, &mut raw)
        })?;
        Ok(Comm {
            raw,
            callbacks: None,
            _ctx: PhantomData,
        })
    }

    /// A communicator over a framework's collectives: this is `rank` of
    /// `size` ranks.
    pub fn with_callbacks(
        ctx: &'a Context,
        rank: i32,
        size: i32,
        callbacks: Box<dyn CommCallbacks + 'a>,
        opts: &CommOptions,
    ) -> Result<Comm<'a>> {
        let mut boxed: Box<CbBox<'a>> = Box::new(callbacks);
        // SAFETY: all-zero is a valid osft_comm_callbacks_t; init writes
        // exactly the size it is given.
        let mut c: sys::osft_comm_callbacks_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        check(unsafe { sys::osft_comm_callbacks_init(&mut c, std::mem::size_of_val(&c)) })?;
        c.user = &mut *boxed as *mut CbBox<'a> as *mut c_void;
        c.rank = rank;
        c.size = size;
        c.allreduce_sum = Some(cb_allreduce);
        c.allgather = Some(cb_allgather);
        c.barrier = Some(cb_barrier);
        let o = raw_options(opts);
        let mut raw = ptr::null_mut();
        // SAFETY: the struct is copied; `user` (the boxed callbacks, at a
        // stable heap address) lives in the Comm until after
        // osft_comm_destroy. On failure the library kept nothing.
        check(unsafe { sys::osft_comm_create_callbacks(ctx.as_raw(), &c, &o, &mut raw) })?;
        Ok(Comm {
            raw,
            callbacks: Some(boxed),
            _ctx: PhantomData,
        })
    }

    /// The raw handle (owned by `self`).
    pub fn as_raw(&self) -> sys::osft_comm_t {
        self.raw
    }

    /// This rank, the number of ranks and the engine.
    pub fn info(&self) -> Result<CommInfo> {
        let (mut rank, mut size, mut e) = (0, 0, 0);
        // SAFETY: a live handle, valid out-pointers.
        check(unsafe { sys::osft_comm_get_info(self.raw, &mut rank, &mut size, &mut e) })?;
        let engine = match e {
            sys::OSFT_COMM_ENGINE_SELF => Engine::SelfRank,
            sys::OSFT_COMM_ENGINE_MPI => Engine::Mpi,
            sys::OSFT_COMM_ENGINE_NCCL => Engine::Nccl,
            sys::OSFT_COMM_ENGINE_CALLBACKS => Engine::Callbacks,
            other => Engine::Unknown(other),
        };
        Ok(CommInfo { rank, size, engine })
    }

    /// Sums `buf` over all ranks, in place (collective).
    pub fn allreduce_sum(&self, buf: &mut TensorMut<'_>) -> Result<()> {
        let mut d = buf.dl();
        // SAFETY: a live handle; `buf` is borrowed exclusively for the call.
        check(unsafe { sys::osft_comm_allreduce_sum(self.raw, &mut d) })
    }

    /// All-gather with per-rank `counts` into `recv` (collective).
    pub fn allgather(
        &self,
        send: &Tensor<'_>,
        recv: &mut TensorMut<'_>,
        counts: &[i64],
    ) -> Result<()> {
        let (s, mut r) = (send.dl(), recv.dl());
        // SAFETY: a live handle; `send` is read, `recv` borrowed
        // exclusively, `counts` holds counts.len() entries.
        check(unsafe {
            sys::osft_comm_allgather(self.raw, &s, &mut r, counts.as_ptr(), counts.len() as i64)
        })
    }

    /// Returns when every rank has entered it (collective).
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_comm_barrier(self.raw) })
    }

    /// The collective counters.
    pub fn stats(&self) -> Result<CommStats> {
        // SAFETY: all-zero is a valid stats struct.
        let mut s: sys::osft_comm_stats_t = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of_val(&s);
        // SAFETY: a live handle, a struct of struct_size bytes.
        check(unsafe { sys::osft_comm_get_stats(self.raw, &mut s) })?;
        Ok(CommStats {
            allreduce_calls: s.allreduce_calls,
            allgather_calls: s.allgather_calls,
            barrier_calls: s.barrier_calls,
            allreduce_bytes: s.allreduce_bytes,
            allgather_bytes: s.allgather_bytes,
            failures: s.failures,
        })
    }

    /// Sets every counter to 0.
    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_comm_reset_stats(self.raw) })
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and owned; projectors and FLCE handles that
        // use it borrow it and were dropped before.
        let st = unsafe { sys::osft_comm_destroy(self.raw) };
        if st == sys::OSFT_STATUS_SUCCESS {
            // The library no longer calls the callbacks: free them now.
            drop(self.callbacks.take());
        } else {
            // Only when a projector or FLCE handle using this communicator
            // was leaked (std::mem::forget): the library keeps the
            // communicator, so its callbacks stay allocated.
            std::mem::forget(self.callbacks.take());
        }
    }
}
