//go:build arm64 && !noasm && gc

package kernels

import (
	"golang.org/x/sys/cpu"

	"shoal/engine/quant"
)

// NEON kernels (dot_arm64.s, written by _generate/arm64): one weight row
// against one activation row, for Q8_0, Q4_0, Q4_K, Q6_K and F16 weights.

//go:noescape
func dotQ8_0SDOT(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotQ8_0NEON(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotQ4_0SDOT(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotQ4_0NEON(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotQ4_KSDOT(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotQ4_KNEON(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotQ6_KSDOT(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotQ6_KNEON(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

//go:noescape
func dotF16NEON(w *byte, ws int, a *byte, as int, nb int, out *float32, os int)

func archLevels() []*level {
	if !cpu.ARM64.HasASIMD {
		return nil
	}
	neon := &level{name: "neon"}
	neon.k[quant.Q8_0] = &kset{blockLen: quant.QK, one: oneQ8_0NEON, rows: dotQ8_0NEON, rowsR: 1}
	neon.k[quant.Q4_0] = &kset{blockLen: quant.QK, one: oneQ4_0NEON, rows: dotQ4_0NEON, rowsR: 1}
	neon.k[quant.Q4_K] = &kset{blockLen: quant.QKK, one: oneQ4_KNEON, rows: dotQ4_KNEON, rowsR: 1}
	neon.k[quant.Q6_K] = &kset{blockLen: quant.QKK, one: oneQ6_KNEON, rows: dotQ6_KNEON, rowsR: 1}
	neon.k[quant.F16] = &kset{blockLen: 16, tail: true, one: oneF16NEON, rows: dotF16NEON, rowsR: 1}
	if !cpu.ARM64.HasASIMDDP {
		return []*level{neon}
	}
	dot := &level{name: "neon-dot"}
	dot.k = neon.k
	dot.k[quant.Q8_0] = &kset{blockLen: quant.QK, one: oneQ8_0SDOT, rows: dotQ8_0SDOT, rowsR: 1}
	dot.k[quant.Q4_0] = &kset{blockLen: quant.QK, one: oneQ4_0SDOT, rows: dotQ4_0SDOT, rowsR: 1}
	dot.k[quant.Q4_K] = &kset{blockLen: quant.QKK, one: oneQ4_KSDOT, rows: dotQ4_KSDOT, rowsR: 1}
	dot.k[quant.Q6_K] = &kset{blockLen: quant.QKK, one: oneQ6_KSDOT, rows: dotQ6_KSDOT, rowsR: 1}
	return []*level{dot, neon}
}

func oneQ8_0NEON(w, a *byte, nb int) (o float32) { dotQ8_0NEON(w, 0, a, 0, nb, &o, 0); return }
func oneQ8_0SDOT(w, a *byte, nb int) (o float32) { dotQ8_0SDOT(w, 0, a, 0, nb, &o, 0); return }
func oneQ4_0NEON(w, a *byte, nb int) (o float32) { dotQ4_0NEON(w, 0, a, 0, nb, &o, 0); return }
func oneQ4_0SDOT(w, a *byte, nb int) (o float32) { dotQ4_0SDOT(w, 0, a, 0, nb, &o, 0); return }
func oneQ4_KNEON(w, a *byte, nb int) (o float32) { dotQ4_KNEON(w, 0, a, 0, nb, &o, 0); return }
func oneQ4_KSDOT(w, a *byte, nb int) (o float32) { dotQ4_KSDOT(w, 0, a, 0, nb, &o, 0); return }
func oneQ6_KNEON(w, a *byte, nb int) (o float32) { dotQ6_KNEON(w, 0, a, 0, nb, &o, 0); return }
func oneQ6_KSDOT(w, a *byte, nb int) (o float32) { dotQ6_KSDOT(w, 0, a, 0, nb, &o, 0); return }
func oneF16NEON(w, a *byte, nb int) (o float32)  { dotF16NEON(w, 0, a, 0, nb, &o, 0); return }
