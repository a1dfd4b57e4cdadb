// Package kv owns the paged KV cache: fixed-size blocks of F16 keys and values
// for a contiguous range of layers, per-sequence block tables, and the export
// and import of blocks as checksummed bytes (for disaggregated prefill/decode
// and migration).
package kv
