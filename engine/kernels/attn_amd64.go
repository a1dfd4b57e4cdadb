//go:build amd64 && !noasm && gc

package kernels

//go:noescape
func axpyF16AVX2(y *float32, alpha float32, x *uint16, n int)
