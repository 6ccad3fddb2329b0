//! Contexts: the device, stream, workspace and allocator every call uses.
use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use osftrt_sys as sys;

use crate::error::{check, Result};

/// Device types (`osft_device_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// The host CPU (OpenBLAS/LAPACK backend).
    Cpu,
    /// A CUDA GPU.
    Cuda,
}

impl DeviceType {
    fn raw(self) -> sys::osft_device_type_t {
        match self {
            DeviceType::Cpu => sys::OSFT_DEVICE_CPU,
            DeviceType::Cuda => sys::OSFT_DEVICE_CUDA,
        }
    }
}

/// How many devices of `device_type` this process can use (1 for the CPU;
/// 0 GPUs when CUDA is not compiled in or there is no GPU).
pub fn device_count(device_type: DeviceType) -> Result<i32> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer for the call.
    check(unsafe { sys::osft_device_count(device_type.raw(), &mut n) })?;
    Ok(n)
}

/// Sets the library's CPU thread count, process-wide: its worker threads and
/// its BLAS engine's (`osft_set_num_threads`). `0` returns to the automatic
/// count (`OSFTRT_NUM_THREADS`, `OMP_NUM_THREADS`, the engine's variable,
/// else the CPUs of the process's affinity). Thread-safe. (Library 1.4.)
///
/// # Errors
/// [`Status::InvalidArgument`](crate::Status::InvalidArgument) for `n < 0`
/// or `n > 1024`.
pub fn set_num_threads(n: i32) -> Result<()> {
    // SAFETY: plain integer argument.
    check(unsafe { sys::osft_set_num_threads(n) })
}

/// The CPU thread count in effect (`osft_get_num_threads`).
pub fn num_threads() -> Result<i32> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer for the call.
    check(unsafe { sys::osft_get_num_threads(&mut n) })?;
    Ok(n)
}

/// Host memory callbacks for a context: every host byte the library
/// allocates for the context comes from here (e.g. a framework's caching
/// allocator). Called from the thread that uses the context.
///
/// # Safety
/// The library writes to what `alloc` returns: an implementation must
/// return NULL or a block of at least `bytes` bytes aligned to `alignment`
/// that nothing else uses until it comes back through `free`.
pub unsafe trait HostAllocator {
    /// Returns `bytes` bytes aligned to `alignment` (a power of two, at
    /// least 64), or NULL on failure (the call then fails with
    /// [`Status::OutOfMemory`](crate::Status::OutOfMemory)).
    fn alloc(&self, bytes: usize, alignment: usize) -> *mut u8;
    /// Returns a block from [`alloc`](Self::alloc), with the size requested.
    ///
    /// # Safety
    /// `ptr` came from `self.alloc(bytes, _)` and was not freed yet.
    unsafe fn free(&self, ptr: *mut u8, bytes: usize);
}

/// Options of [`Context::new`]. `Default` is the library's defaults (a CPU
/// context without a workspace limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextOptions {
    /// The device type.
    pub device_type: DeviceType,
    /// The CUDA device ordinal (0 for the CPU).
    pub device_id: i32,
    /// Upper bound in bytes on the workspace; 0: no limit.
    pub workspace_limit: usize,
    /// CUDA only: fp32 GEMMs may run on TF32 tensor cores (relative error
    /// about 1e-3 instead of 1e-6); never the QR or the SVD. Ignored on the
    /// CPU. Default `false`. (Library 1.1.)
    pub allow_tf32: bool,
}

impl Default for ContextOptions {
    fn default() -> Self {
        let raw = raw_context_options();
        ContextOptions {
            device_type: if raw.device_type == sys::OSFT_DEVICE_CUDA {
                DeviceType::Cuda
            } else {
                DeviceType::Cpu
            },
            device_id: raw.device_id,
            workspace_limit: raw.workspace_limit,
            allow_tf32: raw.allow_tf32 != 0,
        }
    }
}

fn raw_context_options() -> sys::osft_context_options_t {
    // SAFETY: an all-zero osft_context_options_t is a valid value (integers
    // and NULL pointers); osft_context_options_init then writes the defaults
    // into a struct of exactly the size it is told.
    unsafe {
        let mut o: sys::osft_context_options_t = std::mem::zeroed();
        let st = sys::osft_context_options_init(&mut o, std::mem::size_of_val(&o));
        debug_assert_eq!(st, sys::OSFT_STATUS_SUCCESS);
        o
    }
}

/// Memory the library holds for a context, in bytes (`osft_memory_stats_t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Host bytes allocated and not yet freed.
    pub host_in_use: u64,
    /// Peak of `host_in_use` since creation or the last reset.
    pub host_peak: u64,
    /// Device bytes allocated and not yet freed.
    pub device_in_use: u64,
    /// Peak of `device_in_use`.
    pub device_peak: u64,
    /// Host allocations since creation.
    pub host_allocs: u64,
    /// Device allocations since creation.
    pub device_allocs: u64,
    /// The current workspace size (part of the `*_in_use`).
    pub workspace_bytes: u64,
}

/// A libosftrt context: one device, its stream, a reusable workspace and
/// an allocator. Every operation takes one.
///
/// Threads: the C API lets one thread at a time use a context, so a
/// `Context` is [`Send`] (move it to another thread) but not [`Sync`]
/// (never shared between threads). Layers, MLPs, communicators and the
/// other handles borrow their context, so they cannot outlive it and stay
/// on its thread; they are destroyed (dropped) before it, as the C API
/// requires.
///
/// ```
/// let ctx = osftrt::Context::cpu()?;
/// assert_eq!(ctx.device()?, (osftrt::DeviceType::Cpu, 0));
/// ctx.reserve_workspace(1 << 20)?;
/// assert!(ctx.workspace_size()? >= 1 << 20);
/// # Ok::<(), osftrt::Error>(())
/// ```
///
/// A context cannot be shared between threads:
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>(_: &T) {}
/// let ctx = osftrt::Context::cpu().unwrap();
/// shared(&ctx); // error: `Cell<()>` cannot be shared between threads safely
/// ```
pub struct Context {
    raw: sys::osft_context_t,
    // The allocator callbacks' `user`: freed after the context is destroyed.
    allocator: Option<Box<Box<dyn HostAllocator>>>,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the C API allows a context to be used from any thread, one thread
// at a time. `Context` is not `Sync` (PhantomData<Cell<()>>), so a `&Context`
// never reaches a second thread; moving the owner moves all use with it. The
// host allocator box is only called from the thread that uses the context,
// and is `Send` only as part of the context: `HostAllocator` implementors
// are required to be `Send` by `with_allocator`.
unsafe impl Send for Context {}

unsafe extern "C" fn host_alloc_tramp(
    user: *mut c_void,
    bytes: usize,
    align: usize,
) -> *mut c_void {
    // SAFETY: `user` is the `Box<dyn HostAllocator>` that the context owns
    // and frees only after osft_context_destroy returned.
    let a = unsafe { &*(user as *const Box<dyn HostAllocator>) };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.alloc(bytes, align)))
        .unwrap_or(ptr::null_mut())
        .cast()
}

unsafe extern "C" fn host_free_tramp(user: *mut c_void, p: *mut c_void, bytes: usize) {
    // SAFETY: as in host_alloc_tramp; the library passes back a block from
    // host_alloc with its size, exactly once.
    let a = unsafe { &*(user as *const Box<dyn HostAllocator>) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: see above.
        unsafe { a.free(p.cast(), bytes) }
    }));
}

impl Context {
    /// A CPU context with the defaults.
    pub fn cpu() -> Result<Context> {
        Context::new(&ContextOptions::default())
    }

    /// A context with the given options (built-in allocation).
    pub fn new(opts: &ContextOptions) -> Result<Context> {
        Context::create(opts, None)
    }

    /// A context whose host memory comes from `allocator`.
    pub fn with_allocator(
        opts: &ContextOptions,
        allocator: Box<dyn HostAllocator + Send>,
    ) -> Result<Context> {
        Context::create(opts, Some(Box::new(allocator as Box<dyn HostAllocator>)))
    }

    fn create(
        opts: &ContextOptions,
        allocator: Option<Box<Box<dyn HostAllocator>>>,
    ) -> Result<Context> {
        crate::check_library_version()?;
        let mut o = raw_context_options();
        o.device_type = opts.device_type.raw();
        o.device_id = opts.device_id;
        o.workspace_limit = opts.workspace_limit;
        o.allow_tf32 = opts.allow_tf32 as i32;
        // SAFETY: an all-zero osft_allocator_t is valid (NULL callbacks);
        // the init call writes exactly size_of_val(&a) bytes.
        let mut a: sys::osft_allocator_t = unsafe { std::mem::zeroed() };
        // SAFETY: `a` is a live struct of the size passed.
        check(unsafe { sys::osft_allocator_init(&mut a, std::mem::size_of_val(&a)) })?;
        if let Some(b) = &allocator {
            a.user = &**b as *const Box<dyn HostAllocator> as *mut c_void;
            a.host_alloc = Some(host_alloc_tramp);
            a.host_free = Some(host_free_tramp);
            o.allocator = &a;
        }
        let mut raw = ptr::null_mut();
        // SAFETY: `o` and `a` are valid for the call (the library copies the
        // allocator); the boxed allocator outlives the context (it is a
        // field dropped after osft_context_destroy in Drop).
        check(unsafe { sys::osft_context_create(&mut raw, &o) })?;
        Ok(Context {
            raw,
            allocator,
            _not_sync: PhantomData,
        })
    }

    /// The raw handle, for calls through `osftrt_sys`. It stays owned by
    /// `self`.
    pub fn as_raw(&self) -> sys::osft_context_t {
        self.raw
    }

    /// The device type and ordinal.
    pub fn device(&self) -> Result<(DeviceType, i32)> {
        let (mut t, mut id) = (0, 0);
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe { sys::osft_context_get_device(self.raw, &mut t, &mut id) })?;
        let t = if t == sys::OSFT_DEVICE_CUDA {
            DeviceType::Cuda
        } else {
            DeviceType::Cpu
        };
        Ok((t, id))
    }

    /// Sets the CUDA stream (a `cudaStream_t`) for later work.
    ///
    /// # Safety
    /// `stream` must be NULL or a live CUDA stream of the context's device
    /// that outlives its use by the context.
    pub unsafe fn set_stream(&self, stream: *mut c_void) -> Result<()> {
        // SAFETY: the caller vouches for the stream; the handle is live.
        check(unsafe { sys::osft_context_set_stream(self.raw, stream) })
    }

    /// The CUDA stream (NULL on the CPU and for the default stream).
    pub fn stream(&self) -> Result<*mut c_void> {
        let mut s = ptr::null_mut();
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::osft_context_get_stream(self.raw, &mut s) })?;
        Ok(s)
    }

    /// Waits for the context's device work (a no-op on the CPU).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_context_synchronize(self.raw) })
    }

    /// Grows the workspace to at least `bytes` now.
    pub fn reserve_workspace(&self, bytes: usize) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_context_reserve_workspace(self.raw, bytes) })
    }

    /// Frees the workspace (it grows again on demand).
    pub fn release_workspace(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_context_release_workspace(self.raw) })
    }

    /// The workspace size in bytes.
    pub fn workspace_size(&self) -> Result<usize> {
        let mut b = 0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::osft_context_get_workspace_size(self.raw, &mut b) })?;
        Ok(b)
    }

    /// The memory the library holds for this context.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        // SAFETY: all-zero is a valid osft_memory_stats_t.
        let mut s: sys::osft_memory_stats_t = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of_val(&s);
        // SAFETY: a live handle; `s` holds struct_size bytes.
        check(unsafe { sys::osft_context_get_memory_stats(self.raw, &mut s) })?;
        Ok(MemoryStats {
            host_in_use: s.host_in_use,
            host_peak: s.host_peak,
            device_in_use: s.device_in_use,
            device_peak: s.device_peak,
            host_allocs: s.host_allocs,
            device_allocs: s.device_allocs,
            workspace_bytes: s.workspace_bytes,
        })
    }

    /// Sets the peaks to the current in-use values.
    pub fn reset_peak_memory(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::osft_context_reset_peak_memory(self.raw) })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `raw` is live and owned. Every handle created from the
        // context borrows it, so all of them were dropped (destroyed)
        // before; the destroy therefore cannot fail with "handles still
        // alive". The allocator box is dropped after this, once the library
        // has returned every block.
        let st = unsafe { sys::osft_context_destroy(self.raw) };
        if st == sys::OSFT_STATUS_SUCCESS || st == sys::OSFT_STATUS_BACKEND_ERROR {
            drop(self.allocator.take());
        } else {
            // Only reachable when a handle of this context was leaked
            // (std::mem::forget): the library then keeps the context, and
            // its blocks, so the allocator they came from is leaked too.
            std::mem::forget(self.allocator.take());
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("raw", &self.raw).finish()
    }
}
