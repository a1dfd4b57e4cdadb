package vulkan

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatVec: the decode product (one vector) and an 8-vector and a
// 64-vector product of a 4096×4096 matrix in each format; GB/s is the
// weight bytes read per second.
func BenchmarkMatVec(b *testing.B) {
	g := gpuOrSkip(b)
	r := rand.New(rand.NewPCG(1, 1))
	for _, typ := range matvecFormats {
		m := randMatrix(r, typ, 4096, 4096)
		d, err := g.Upload(m)
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%v/n%d", typ, n), func(b *testing.B) {
				x, y := floats(b, g, make([]float32, n*m.Cols)), floats(b, g, make([]float32, n*m.Rows))
				defer x.Free()
				defer y.Free()
				b.SetBytes(int64(len(m.Data)))
				for b.Loop() {
					cmd := g.ctx.Begin()
					d.MatVec(cmd, Vec{B: x, Stride: m.Cols}, n, Vec{B: y, Stride: m.Rows})
					if err := cmd.Submit(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		d.Free()
	}
}
