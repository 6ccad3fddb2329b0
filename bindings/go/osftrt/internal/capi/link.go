// Package capi is the SWIG-generated layer of the Go binding (capi.go,
// osftrt_wrap.c: regenerate with generate.sh), internal to package osftrt.
// This file links it with the installed library through pkg-config.
package capi

// #cgo pkg-config: osftrt
// #cgo CFLAGS: -Wno-unused-function -Wno-unused-variable
import "C"

//go:generate bash generate.sh
