//go:build !noasm

package bench

import "golang.org/x/sys/cpu"

//go:noescape
func triadAVX2(a, b, c *float64, n int, s float64)

func init() {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		triadKernel = func(a, b, c []float64, s float64) {
			n := len(a) &^ 15
			if n > 0 {
				triadAVX2(&a[0], &b[0], &c[0], n, s)
			}
			triadGo(a[n:], b[n:], c[n:], s)
		}
	}
}
