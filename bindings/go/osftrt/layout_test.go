package osftrt

import (
	"testing"
	"unsafe"

	"libosftrt/osftrt/internal/capi"
)

// The Go mirrors of the C call buffer must have the C layout.
func TestCallBufferLayout(t *testing.T) {
	var b callBuf
	var d cDesc
	want := []struct {
		name string
		got  uintptr
		what int
	}{
		{"sizeof(osftgo_call_t)", unsafe.Sizeof(b), 0},
		{"sizeof(osftgo_desc_t)", unsafe.Sizeof(d), 1},
		{"offsetof(osftgo_call_t, h)", unsafe.Offsetof(b.h), 2},
		{"offsetof(osftgo_call_t, i)", unsafe.Offsetof(b.i), 3},
		{"offsetof(osftgo_call_t, out)", unsafe.Offsetof(b.out), 4},
		{"offsetof(osftgo_call_t, err)", unsafe.Offsetof(b.err), 5},
		{"offsetof(osftgo_desc_t, ndim)", unsafe.Offsetof(d.ndim), 6},
		{"offsetof(osftgo_desc_t, shape)", unsafe.Offsetof(d.shape), 7},
		{"offsetof(osftgo_desc_t, has_strides)", unsafe.Offsetof(d.hasStrides), 8},
	}
	for _, w := range want {
		if c := capi.Osftgo_layout(w.what); int64(w.got) != c {
			t.Errorf("%s: Go %d, C %d", w.name, w.got, c)
		}
	}
}
