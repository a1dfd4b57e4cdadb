// Package cpu is the CPU device: it runs a layer range with the engine's
// kernels (engine/kernels) on a persistent worker pool, its weights the
// host's own (mapped file views, not copied) and its KV rows in host memory
// (kv.HostStore). It is the arithmetic the engine always had, moved behind
// the device seam unchanged; it must not orchestrate (batches, sequences,
// tensor-parallel all-reduces at the end of a half are the runner's).
package cpu
