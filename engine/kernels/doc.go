// Package kernels owns the hot dot products and matrix products, one generic Go
// version per format beside platform assembly.
//
// The generic versions follow ggml's scalar ggml_vec_dot_* functions
// (ggml-cpu quants.c and vec.c): integer sums inside each block, then float32
// scales, summed in the same order, so that results match ggml's generic CPU
// path. The raw rows are read in place; float rows are viewed with
// unsafe.Slice, which assumes a little-endian host (as all of Go's main
// targets are).
//
// The platform kernels, chosen per CPU by dispatch.go in named levels, agree
// with the generic versions up to the order of float32 sums. On arm64
// (dot_arm64.s, written by _generate/arm64.py) there are NEON kernels for
// Q8_0 and Q4_0 weights against Q8_0, Q4_K and Q6_K against Q8_K, and F16,
// each one weight row against one activation row: level "neon-dot" uses SDOT
// (FEAT_DotProd), level "neon" widens with SMULL/SADALP instead.
package kernels
