package parallel

import (
	"strings"
	"testing"

	"shoal/placement"
	"shoal/shard"
)

func TestLayout(t *testing.T) {
	tp2 := []placement.Member{
		{Node: "a", TPRank: 0, TPSize: 2, HeadLo: 0, HeadHi: 4, FFNLo: 0, FFNHi: 352, Embedding: true},
		{Node: "b", TPRank: 1, TPSize: 2, HeadLo: 4, HeadHi: 8, FFNLo: 352, FFNHi: 704},
	}
	plan := func(stages ...placement.Stage) placement.Plan {
		return placement.Plan{Version: 2, Model: "m", Pools: []placement.Pool{{Role: placement.RoleShared, Stages: stages}}}
	}
	good := plan(placement.Stage{Lo: 0, Hi: 2, Members: tp2}, placement.Stage{Lo: 2, Hi: 4, Members: []placement.Member{{Node: "c", TPSize: 1, Output: true}}})
	addrs := map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2", "c": "127.0.0.1:3"}
	l, err := newLayout(good, "", addrs)
	if err != nil {
		t.Fatal(err)
	}
	if l.Embedder.Node != "a" || l.Output.Node != "c" || !l.receivesEmbedding(l.Stages[0].Members[1]) {
		t.Errorf("embedder %v, output %v", l.Embedder, l.Output)
	}
	for _, node := range []string{"a", "b", "c"} {
		for _, spec := range shard.SpecsFor(good, node, "sha") {
			m, err := l.locate(node, spec.Lo, spec.Hi, spec.TPRank)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.checkSpec(m, spec); err != nil {
				t.Errorf("%s: %v", node, err)
			}
			spec.HeadHi++
			if err := l.checkSpec(m, spec); err == nil && spec.TPSize > 1 {
				t.Errorf("%s: a spec with other heads than the plan's passed", node)
			}
		}
	}
	if _, err := l.locate("c", 0, 2, 0); err == nil {
		t.Error("node c located in stage 0")
	}

	noEmbd := plan(placement.Stage{Lo: 0, Hi: 4, Members: []placement.Member{{Node: "c", TPSize: 1, Output: true}}})
	gap := plan(placement.Stage{Lo: 0, Hi: 2, Members: tp2}, placement.Stage{Lo: 3, Hi: 4, Members: []placement.Member{{Node: "c", Output: true}}})
	badRank := plan(placement.Stage{Lo: 0, Hi: 4, Members: []placement.Member{tp2[1], tp2[0]}})
	for _, tc := range []struct {
		name  string
		plan  placement.Plan
		pool  string
		addrs map[string]string
		want  string
	}{
		{"no address", good, "", map[string]string{"a": "x", "b": "y"}, "no address for node c"},
		{"no pool", good, placement.RoleDecode, addrs, "no \"decode\" pool"},
		{"no embedding", noEmbd, "", addrs, "embedding"},
		{"layer gap", gap, "", addrs, "layers [3,4)"},
		{"ranks out of order", badRank, "", addrs, "rank 1 of 2, want 0"},
	} {
		_, err := newLayout(tc.plan, tc.pool, tc.addrs)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
