// Package kv owns the paged KV cache: fixed-size blocks of F16 keys and values
// for a contiguous range of layers, per-sequence block tables, and the export
// and import of blocks as checksummed bytes (for migration) and of one
// layer's K and V for a run of positions and KV heads (ranges.go, for
// disaggregated prefill/decode between differently split pools).
package kv
