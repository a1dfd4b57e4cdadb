package placement

import (
	"fmt"
	"testing"

	"shoal/engine/quant"
)

// BenchmarkPlace16 plans a 70B-class model on 16 unequal nodes in two racks.
func BenchmarkPlace16(b *testing.B) {
	prof, err := shape{name: "llama-70b", layers: 80, embd: 8192, heads: 64, kv: 8, ff: 28672, vocab: 128256, typ: quant.Q4_K, out: quant.Q6_K}.profile()
	if err != nil {
		b.Fatal(err)
	}
	var nodes []Node
	var links LinkMatrix
	links.Default = Link{Gbit: 10, LatencyMs: 0.2}
	for i := range 16 {
		nodes = append(nodes, Node{ID: fmt.Sprintf("n%02d", i), Status: StatusAlive, MemFree: uint64(8+4*(i%4)) << 30, GFLOPS: float64(200 + 50*(i%5)), MemGBps: float64(40 + 20*(i%3))})
	}
	for i := range 16 {
		for j := i + 1; j < 16; j++ {
			if i/8 == j/8 {
				links.Set(nodes[i].ID, nodes[j].ID, Link{Gbit: 100, LatencyMs: 0.01})
			}
		}
	}
	for b.Loop() {
		if _, err := Place(prof, nodes, links, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
