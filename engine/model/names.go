package model

import (
	"strconv"
	"strings"
)

// LayerTensor splits a layer tensor's GGUF name, "blk.12.attn_q.weight",
// into its layer (12) and its role in the layer ("attn_q.weight"); ok is
// false for tensors outside the layers (token_embd.weight, output.weight).
func LayerTensor(name string) (layer int, role string, ok bool) {
	rest, found := strings.CutPrefix(name, "blk.")
	if !found {
		return 0, "", false
	}
	num, role, found := strings.Cut(rest, ".")
	if !found {
		return 0, "", false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 {
		return 0, "", false
	}
	return n, role, true
}
