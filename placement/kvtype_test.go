package placement

import (
	"testing"

	"shoal/engine/quant"
)

// TestKVTypeContext: on the same node, the longest context that fits is at
// least 1.8x with a Q8_0 cache and 3x with Q4_0 what it is with F16, and
// the plan says which cache it was made for.
func TestKVTypeContext(t *testing.T) {
	prof, err := shape{name: "m", layers: 32, embd: 4096, heads: 32, kv: 8, ff: 14336, vocab: 32000, typ: quant.Q4_K, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	node := Node{ID: "a", Status: StatusAlive, MemFree: 12 << 30, GFLOPS: 100, MemGBps: 50}
	longest := func(kvType string) int {
		lo, hi := 0, MaxContext
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if _, err := Place(prof, []Node{node}, LinkMatrix{}, Options{Context: mid, KVType: kvType}); err == nil {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		return lo
	}
	f16, q8, q4 := longest(""), longest("q8_0"), longest("q4_0")
	t.Logf("longest context on 12 GiB: f16 %d, q8_0 %d (%.2fx), q4_0 %d (%.2fx)", f16, q8, float64(q8)/float64(f16), q4, float64(q4)/float64(f16))
	if f16 < 1024 || float64(q8) < 1.8*float64(f16) || float64(q4) < 3*float64(f16) {
		t.Errorf("longest contexts f16 %d, q8_0 %d, q4_0 %d", f16, q8, q4)
	}
	p, err := Place(prof, []Node{node}, LinkMatrix{}, Options{Context: q8, KVType: "q8_0"})
	if err != nil || p.KVType != "q8_0" {
		t.Errorf("plan at %d tokens with q8_0: kv type %q, %v", q8, p.KVType, err)
	}
	if _, err := Place(prof, []Node{node}, LinkMatrix{}, Options{KVType: "q5_1"}); err == nil {
		t.Error("a q5_1 cache was planned")
	}
}
