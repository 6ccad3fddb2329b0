package osftrt

import (
	"fmt"
	"sync"

	"libosftrt/osftrt/internal/capi"
)

// HeaderVersion is the version of the headers this binding was generated
// from (OSFT_VERSION_NUMBER: MAJOR*10000 + MINOR*100 + PATCH).
var HeaderVersion = capi.OSFT_VERSION_NUMBER

// Version is the loaded library's version number (osft_version).
func Version() int { return int(capi.Osft_version()) }

// VersionString is the loaded library's "MAJOR.MINOR.PATCH".
func VersionString() string { return capi.Osft_version_string() }

// BuildInfo describes how the library was built.
func BuildInfo() string { return capi.Osft_build_info() }

// CheckVersion fails when the loaded library's major version differs from
// the headers', or the library is older than them (ABI.md).
func CheckVersion() error {
	v := Version()
	if v/10000 != HeaderVersion/10000 || v < HeaderVersion {
		return &Error{Status: StatusNotSupported, Op: "CheckVersion",
			Message: fmt.Sprintf("libosftrt %s loaded, the binding needs %d.x >= %d", VersionString(), HeaderVersion/10000, HeaderVersion)}
	}
	return nil
}

// Feature is an optional component (osft_feature_t).
type Feature int

// Features.
var (
	FeatureCUDA = Feature(capi.OSFT_FEATURE_CUDA)
	FeatureNCCL = Feature(capi.OSFT_FEATURE_NCCL)
	FeatureMPI  = Feature(capi.OSFT_FEATURE_MPI)
)

// HasFeature reports whether a component was compiled in.
func HasFeature(f Feature) bool {
	return capi.Osft_has_feature(capi.Enum_SS_osft_feature_e(f)) != 0
}

// ClearLastError forgets the calling OS thread's last C error message. The
// binding never needs it (messages are captured with each failure); it is
// here for completeness of the C API.
func ClearLastError() { capi.Osft_clear_last_error() }

// LogLevel is a diagnostics severity (osft_log_level_t).
type LogLevel int

// Levels.
var (
	LogOff   = LogLevel(capi.OSFT_LOG_OFF)
	LogError = LogLevel(capi.OSFT_LOG_ERROR)
	LogWarn  = LogLevel(capi.OSFT_LOG_WARN)
	LogInfo  = LogLevel(capi.OSFT_LOG_INFO)
	LogDebug = LogLevel(capi.OSFT_LOG_DEBUG)
)

var logMu sync.Mutex

// SetLogSink installs f as the process-wide log sink for messages up to
// maxLevel (nil removes it). f may be called from several goroutines/threads
// at once and must not call SetLogSink; it may run inside a call that holds
// a context's lock, so it must not call osftrt on that context either.
func SetLogSink(f func(level LogLevel, message string), maxLevel LogLevel) error {
	logMu.Lock()
	defer logMu.Unlock()
	if f != nil {
		g := func(level int, msg string) { f(LogLevel(level), msg) }
		capi.LogHook.Store(&g)
	}
	var err error
	st := capi.SetLog(f != nil, int(maxLevel))
	if st != 0 {
		err = &Error{Status: Status(st), Op: "SetLogSink", Message: "max level " + fmt.Sprint(int(maxLevel)) + " is not a log level"}
	} else if f == nil {
		capi.LogHook.Store(nil)
	}
	return err
}
