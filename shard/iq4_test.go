package shard

import (
	"bytes"
	"testing"

	"shoal/engine/model"
	"shoal/engine/quant"
	"shoal/engine/synth"
)

// Slicing the i-quant matrices on their block boundaries: IQ4_XS blocks are
// 256 columns (FFN [512,1024) is two blocks, FFN [384,1024) is not on a
// boundary and falls back to whole output rows), IQ4_NL blocks 32 (FFN
// [384,1024) is 8 blocks and is cut by columns).
func TestIQ4Slices(t *testing.T) {
	for _, tc := range []iquantSlice{
		{"iq4_xs", quant.IQ4_XS, 512, true},
		{"iq4_xs", quant.IQ4_XS, 384, false},
		{"iq4_nl", quant.IQ4_NL, 384, true},
		{"iq4_nl", quant.IQ4_NL, 400, false},
	} {
		checkIQuantSlice(t, tc)
	}
}

// iquantSlice is a case of TestIQ4Slices: a model of type typ (its
// matrices of type qt) cut to FFN columns [ffnLo,1024), on qt's block
// boundaries or not.
type iquantSlice struct {
	typ     string
	qt      quant.Type
	ffnLo   int
	aligned bool
}

func checkIQuantSlice(t *testing.T, tc iquantSlice) {
	t.Helper()
	s := synth.Spec{Arch: "llama", NEmbd: 512, NLayer: 2, NHead: 8, NHeadKV: 2, NFF: 1024, Type: tc.typ, Seed: 3, Name: "dense-" + tc.typ}
	m := writeModel(t, s)
	spec := ShardSpec{Model: s.Name, FileSHA: m.sha, Lo: 0, Hi: 2, TPRank: 1, TPSize: 2, HeadLo: 4, HeadHi: 8, FFNLo: tc.ffnLo, FFNHi: 1024}
	sh, err := Open(m.path, spec)
	if err != nil {
		t.Fatalf("%s FFN [%d,1024): %v", tc.typ, tc.ffnLo, err)
	}
	down, ok := sh.Tensor("blk.1.ffn_down.weight")
	if !ok {
		t.Fatalf("%s: ffn_down missing", tc.typ)
	}
	if down.Info.Type != tc.qt {
		t.Fatalf("%s: ffn_down is %v", tc.typ, down.Info.Type)
	}
	if tc.aligned {
		if down.Cols() != 1024-tc.ffnLo || down.Rows() != 512 {
			t.Errorf("%s FFN [%d,1024): ffn_down holds %d x %d", tc.typ, tc.ffnLo, down.Rows(), down.Cols())
		}
		if !bytes.Equal(down.Data, m.cut(t, down.Name, 0, 512, tc.ffnLo, 1024)) {
			t.Errorf("%s: ffn_down columns differ from the file", tc.typ)
		}
	} else {
		lo, hi := model.OutputRows(1, 2, 512)
		if down.Cols() != 1024 || len(down.RowRuns) != 1 || down.RowRuns[0] != [2]int{lo, hi} {
			t.Errorf("%s FFN [%d,1024): ffn_down holds rows %v of %d columns, want rows [%d,%d) of 1024", tc.typ, tc.ffnLo, down.RowRuns, down.Cols(), lo, hi)
		}
		if !bytes.Equal(down.Data, m.cut(t, down.Name, lo, hi, 0, 1024)) {
			t.Errorf("%s: ffn_down rows differ from the file", tc.typ)
		}
	}
	// attn_output: heads [4,8) of 64 are columns [256,512), on both
	// types' boundaries.
	if ao, _ := sh.Tensor("blk.0.attn_output.weight"); ao.Cols() != 256 || !bytes.Equal(ao.Data, m.cut(t, ao.Name, 0, 512, 256, 512)) {
		t.Errorf("%s: attn_output slice wrong (%d columns)", tc.typ, ao.Cols())
	}
	if _, err := sh.Model(); err != nil {
		t.Errorf("%s FFN [%d,1024): the engine does not take the shard: %v", tc.typ, tc.ffnLo, err)
	}
	sh.Close()
}
