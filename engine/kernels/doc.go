// Package kernels owns the hot dot products and matrix products, one generic Go
// version per format beside platform assembly.
//
// The generic versions follow ggml's scalar ggml_vec_dot_* functions
// (ggml-cpu quants.c and vec.c): integer sums inside each block, then float32
// scales, summed in the same order, so that results match ggml's generic CPU
// path. The raw rows are read in place; float rows are viewed with
// unsafe.Slice, which assumes a little-endian host (as all of Go's main
// targets are).
package kernels
