package kernels

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"shoal/engine/quant"
)

// IQ4 weight rows of random bytes (every nibble and 6-bit scale, either
// sign of d) against quantized activations (or activation quants of random
// bytes, -128 included): every kernel set agrees with the
// generic dot, and the generic dot with the float64 dot of the dequantized
// rows.
func TestIQ4RandomBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, typ := range []quant.Type{quant.IQ4_NL, quant.IQ4_XS} {
		bl, bs := typ.BlockLen(), typ.BlockSize()
		for _, nb := range []int{1, 2, 3, 5, 8, 9} {
			n := nb * bl
			for trial := 0; trial < 20; trial++ {
				w := make([]byte, typ.RowSize(n))
				for i := range w {
					w[i] = byte(r.Uint32())
				}
				for b := 0; b < nb; b++ {
					// d in ±[2^-10, 2^-3): finite, and products of a
					// reasonable size
					h := uint16(0x1400 + r.IntN(0x1c00))
					if r.IntN(2) == 0 {
						h |= 0x8000
					}
					w[b*bs], w[b*bs+1] = byte(h), byte(h>>8)
				}
				_, a, _, _ := rows(r, typ, n)
				if trial%4 == 0 {
					// activation quants of any int8 value, -128 included
					at := quant.VecDotType(typ)
					off, abs := 2, at.BlockSize()
					if at == quant.Q8_K {
						off = 4
					}
					for b := 0; b < n/at.BlockLen(); b++ {
						for j := 0; j < at.BlockLen(); j++ {
							a[b*abs+off+j] = byte(r.Uint32())
						}
						a[b*abs+off] = 0x80
					}
				}
				checkIQDot(t, typ, n, w, a)
			}
		}
	}
}

// On amd64 every level but generic has IQ4 kernels.
func TestIQ4Wired(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("IQ4 kernels are amd64 only")
	}
	eachLevel(t, func(level string) {
		for _, typ := range []quant.Type{quant.IQ4_NL, quant.IQ4_XS} {
			if got := kernelsFor(typ) != nil; got != (level != "generic") {
				t.Errorf("%s: %v has platform kernels: %v", level, typ, got)
			}
		}
	})
}
