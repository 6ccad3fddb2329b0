//! Versions, build information, optional features and logging.
use std::ffi::{c_void, CStr};
use std::os::raw::c_char;
use std::sync::Mutex;

use osftrt_sys as sys;

use crate::error::{check, Error, Result, Status};

/// The version of the headers these bindings were generated from
/// (`OSFT_VERSION_NUMBER`: MAJOR * 10000 + MINOR * 100 + PATCH).
pub const HEADER_VERSION: u32 = sys::OSFT_VERSION_NUMBER;

/// The loaded library's version as MAJOR * 10000 + MINOR * 100 + PATCH.
pub fn version() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { sys::osft_version() }
}

fn static_str(p: *const c_char) -> &'static str {
    // SAFETY: the library's version/build strings are static, NUL-terminated
    // and never NULL (version.h).
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

/// The loaded library's version as "MAJOR.MINOR.PATCH".
pub fn version_string() -> &'static str {
    // SAFETY: no arguments; returns a static string.
    static_str(unsafe { sys::osft_version_string() })
}

/// One line describing how the library was built (compiler, BLAS, CUDA,
/// NCCL, MPI), for bug reports.
pub fn build_info() -> &'static str {
    // SAFETY: no arguments; returns a static string.
    static_str(unsafe { sys::osft_build_info() })
}

/// Refuses a library whose major version differs from the headers', or
/// which is older than them (ABI.md, "Versions"). [`Context`](crate::Context)
/// constructors call it.
pub fn check_library_version() -> Result<()> {
    let v = version();
    if v / 10000 != HEADER_VERSION / 10000 || v < HEADER_VERSION {
        return Err(Error::new(
            Status::NotSupported,
            format!(
                "osftrt: the loaded libosftrt is {} ({v}); these bindings need {}.x, at least {}",
                version_string(),
                HEADER_VERSION / 10000,
                HEADER_VERSION
            ),
        ));
    }
    Ok(())
}

/// Optional components of a build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// The CUDA backend.
    Cuda,
    /// NCCL communicators.
    Nccl,
    /// MPI communicators.
    Mpi,
}

/// Whether `feature` was compiled into the loaded library (not whether the
/// hardware is there: see [`device_count`](crate::device_count)).
pub fn has_feature(feature: Feature) -> bool {
    let f = match feature {
        Feature::Cuda => sys::OSFT_FEATURE_CUDA,
        Feature::Nccl => sys::OSFT_FEATURE_NCCL,
        Feature::Mpi => sys::OSFT_FEATURE_MPI,
    };
    // SAFETY: accepts any value, cannot fail.
    unsafe { sys::osft_has_feature(f) != 0 }
}

/// Log severities, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// As a maximum level: deliver nothing.
    Off,
    /// A call failed.
    Error,
    /// Works, but not as well as it could.
    Warn,
    /// Resource events.
    Info,
    /// Per-call decisions.
    Debug,
}

impl LogLevel {
    fn raw(self) -> sys::osft_log_level_t {
        match self {
            LogLevel::Off => sys::OSFT_LOG_OFF,
            LogLevel::Error => sys::OSFT_LOG_ERROR,
            LogLevel::Warn => sys::OSFT_LOG_WARN,
            LogLevel::Info => sys::OSFT_LOG_INFO,
            LogLevel::Debug => sys::OSFT_LOG_DEBUG,
        }
    }

    fn from_raw(l: sys::osft_log_level_t) -> LogLevel {
        match l {
            sys::OSFT_LOG_ERROR => LogLevel::Error,
            sys::OSFT_LOG_WARN => LogLevel::Warn,
            sys::OSFT_LOG_INFO => LogLevel::Info,
            sys::OSFT_LOG_DEBUG => LogLevel::Debug,
            _ => LogLevel::Off,
        }
    }
}

type LogSink = Box<dyn Fn(LogLevel, &str) + Send + Sync>;

// The installed sink (a leaked Box<LogSink> as usize), freed when replaced.
static SINK: Mutex<usize> = Mutex::new(0);

unsafe extern "C" fn log_tramp(
    user: *mut c_void,
    level: sys::osft_log_level_t,
    msg: *const c_char,
) {
    // SAFETY: `user` is the Box<LogSink> installed by set_log_callback; the
    // library stops calling it before set_log_callback returns on a
    // replacement, and only then is it freed. `msg` is a NUL-terminated
    // string valid during the call.
    let (sink, msg) = unsafe { (&*(user as *const LogSink), CStr::from_ptr(msg)) };
    let msg = msg.to_string_lossy();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sink(LogLevel::from_raw(level), &msg)
    }));
}

/// Installs `sink` as the process-wide log sink for messages up to
/// `max_level` (`None` removes it). The sink may run on any thread that is
/// inside the library, several at once. A panic in it is caught.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let s = seen.clone();
/// osftrt::set_log_callback(
///     Some(Box::new(move |_lvl, msg: &str| s.lock().unwrap().push(msg.to_string()))),
///     osftrt::LogLevel::Error,
/// )?;
/// assert!(osftrt::Flce::new(&osftrt::Context::cpu()?, &osftrt::FlceOptions {
///     label_smoothing: 2.0, ..Default::default() }).is_err());
/// osftrt::set_log_callback(None, osftrt::LogLevel::Off)?;
/// assert!(seen.lock().unwrap().iter().any(|m| m.contains("label_smoothing")));
/// # Ok::<(), osftrt::Error>(())
/// ```
pub fn set_log_callback(sink: Option<LogSink>, max_level: LogLevel) -> Result<()> {
    let mut cur = SINK.lock().unwrap_or_else(|e| e.into_inner());
    let new = sink
        .map(|s| Box::into_raw(Box::new(s)) as usize)
        .unwrap_or(0);
    let cb: sys::osft_log_callback_t = if new != 0 { Some(log_tramp) } else { None };
    // SAFETY: `new` is a leaked Box<LogSink> (or 0 with no callback) that
    // stays alive until it is replaced here, under the SINK lock.
    let st = unsafe { sys::osft_set_log_callback(cb, new as *mut c_void, max_level.raw()) };
    if let Err(e) = check(st) {
        if new != 0 {
            // SAFETY: the library refused it, so it never saw `new`.
            drop(unsafe { Box::from_raw(new as *mut LogSink) });
        }
        return Err(e);
    }
    let old = std::mem::replace(&mut *cur, new);
    if old != 0 {
        // SAFETY: the library no longer calls the old sink once
        // osft_set_log_callback has returned (log.h); it was leaked by us.
        drop(unsafe { Box::from_raw(old as *mut LogSink) });
    }
    Ok(())
}
