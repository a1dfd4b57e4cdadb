// Package device is the seam between a model's orchestration (engine/model:
// layer ranges, tensor-parallel groups, the runner) and the hardware that
// runs a layer's arithmetic. A Device loads a layer range (and a
// tensor-parallel member's slice of it) as weights it owns, and keeps the KV
// rows of that range in a kv.Store it owns; the host keeps the block tables
// (kv.Cache). A loaded Range runs a layer's attention half and FFN half up
// to their collective points, the residual adds, the output head, and a
// whole-range forward for a member with no tensor-parallel group.
//
// The CPU device (device/cpu) is the engine's original code; GPU backends
// implement the same interfaces. This package holds only the contracts and
// the host-side types the loader fills; it must not know GGUF names,
// sequences or the network (a collective reaches it as an interface).
package device
