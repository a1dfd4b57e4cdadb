//go:build amd64 && !noasm && gc

package kernels

import "strings"

// The matrix kernels in dot_amd64.s (the tile kernels, of type dotFn, and
// the decode kernels with auxPrep data, rowsXFn) have no Go declarations:
// they are file-local symbols, listed in two address tables with their names
// in dot_amd64.go, and called through the trampolines callTile and
// callRowsX (see static.go in _generate). tileKernel and rowsXKernel return
// them by name.
var (
	tilePCs  = kernelPCs(tileKernelNames, tileKernelTable()[:])
	rowsXPCs = kernelPCs(rowsXKernelNames, rowsXKernelTable()[:])
)

// kernelPCs maps each name in names (separated by spaces) to its address in
// table, which lists them in the same order.
func kernelPCs(names string, table []uintptr) map[string]uintptr {
	f := strings.Fields(names)
	if len(f) != len(table) {
		panic("kernels: the kernel table and its names disagree: regenerate dot_amd64.s and dot_amd64.go")
	}
	m := make(map[string]uintptr, len(f))
	for i, name := range f {
		m[name] = table[i]
	}
	return m
}

// kernelPC returns the address of the kernel name in pcs, and panics when
// there is none: a kernel of another signature, or none at all, must not
// be called.
func kernelPC(pcs map[string]uintptr, kind, name string) uintptr {
	pc, ok := pcs[name]
	if !ok {
		panic("kernels: no " + kind + " kernel " + name + " in dot_amd64.s")
	}
	return pc
}

// tileKernel returns the tile kernel name.
func tileKernel(name string) dotFn {
	pc := kernelPC(tilePCs, "tile", name)
	return func(w *byte, ws int, a *byte, as int, nb int, out *float32, os int) {
		callTile(w, ws, a, as, nb, out, os, pc)
	}
}

// rowsXKernel returns the decode kernel with auxPrep data name.
func rowsXKernel(name string) rowsXFn {
	pc := kernelPC(rowsXPCs, "rowsX", name)
	return func(w *byte, ws int, a *byte, aux *byte, nb int, out *float32) {
		callRowsX(w, ws, a, aux, nb, out, pc)
	}
}

// oneKernel returns the dot of one weight row with one activation row by
// the tile kernel name, of one or two weight rows (two read the row twice)
// and one activation row. It calls callTile itself, not a func value, so
// that the result stays on the stack.
func oneKernel(name string) oneFn {
	pc := kernelPC(tilePCs, "tile", name)
	return func(w, a *byte, nb int) float32 {
		var o [2]float32
		callTile(w, 0, a, 0, nb, &o[0], 0, pc)
		return o[0]
	}
}
