package model

import (
	"slices"
	"strings"
	"testing"
)

// TestRegisterRefusesDuplicates: a second registration of a name panics
// and leaves the first one in place; so does a registration without a name.
func TestRegisterRefusesDuplicates(t *testing.T) {
	before := archs["llama"]
	for _, a := range []Arch{{Name: "llama", Rope: RopeNeoX}, {Name: ""}} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.HasPrefix(msg, "model: Register") {
					t.Errorf("Register(%+v) did not panic with a clear message (recovered %q)", a, msg)
				}
			}()
			Register(a)
		}()
	}
	if archs["llama"] != before {
		t.Errorf("llama is now %+v, was %+v", archs["llama"], before)
	}
	if slices.Contains(Archs(), "") {
		t.Error("an architecture without a name was registered")
	}
}

func TestLayerTensor(t *testing.T) {
	for _, c := range []struct {
		name  string
		layer int
		role  string
		ok    bool
	}{
		{"blk.12.attn_q.weight", 12, "attn_q.weight", true},
		{"blk.0.ffn_down_exps.weight", 0, "ffn_down_exps.weight", true},
		{"token_embd.weight", 0, "", false},
		{"blk.x.attn_q.weight", 0, "", false},
		{"blk.-1.attn_q.weight", 0, "", false},
		{"blk.3", 0, "", false},
	} {
		layer, role, ok := LayerTensor(c.name)
		if layer != c.layer || role != c.role || ok != c.ok {
			t.Errorf("LayerTensor(%q) = %d %q %v, want %d %q %v", c.name, layer, role, ok, c.layer, c.role, c.ok)
		}
	}
}
