//go:build amd64 && !noasm && gc

package kernels

import (
	"runtime"
	"strings"
	"testing"
)

// The generator and the Go side agree on the kernel tables: each has as
// many entries as its name list, each entry is the start of the function of
// that name, and a kernel is found by its name in its own table only (a
// kernel of the other signature must not be called through the wrong
// trampoline).
func TestKernelTables(t *testing.T) {
	tile := func(name string) { tileKernel(name) }
	rowsX := func(name string) { rowsXKernel(name) }
	checkKernelTable(t, "tile", tileKernelNames, tileKernelTable()[:], tile, rowsX)
	checkKernelTable(t, "rowsX", rowsXKernelNames, rowsXKernelTable()[:], rowsX, tile)
	if panicked(func() { tileKernel("dotQ4_0R9C9") }) == nil {
		t.Error("tileKernel returned a kernel for an unknown name")
	}
}

// checkKernelTable checks the table of one signature: get looks a kernel
// up in it, getElse in the other one.
func checkKernelTable(t *testing.T, kind, names string, table []uintptr, get, getElse func(name string)) {
	f := strings.Fields(names)
	if len(f) != len(table) || len(f) == 0 {
		t.Fatalf("%s: %d names, %d table entries", kind, len(f), len(table))
	}
	for i, name := range f {
		pc := table[i]
		if fn := runtime.FuncForPC(pc); fn == nil || fn.Entry() != pc || strings.TrimSuffix(fn.Name(), "<>") != name {
			t.Errorf("%s table entry %d is %#x, not the start of %s (%s)", kind, i, pc, name, fn.Name())
		}
		if p := panicked(func() { get(name) }); p != nil {
			t.Errorf("%s kernel %s: %v", kind, name, p)
		}
		if panicked(func() { getElse(name) }) == nil {
			t.Errorf("%s kernel %s found as a kernel of the other signature", kind, name)
		}
	}
}

func panicked(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}
