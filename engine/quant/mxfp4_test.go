package quant

import (
	"encoding/binary"
	"math"
	"os"
	"slices"
	"testing"
)

// TestMXFP4: gguf-py's (llama.cpp 0.7.0's) MXFP4 bytes for random rows at
// scales from 1e-3 to 1e4, a zero block and a block of exact levels are
// what QuantizeRow writes, and DequantizeRow gives its values bit for bit.
func TestMXFP4(t *testing.T) {
	raw, err := os.ReadFile("testdata/mxfp4.bin")
	if err != nil {
		t.Fatal(err)
	}
	n := int(binary.LittleEndian.Uint32(raw))
	floats := func(b []byte) []float32 {
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out
	}
	x := floats(raw[4 : 4+4*n])
	qb := MXFP4.RowSize(n)
	want := raw[4+4*n : 4+4*n+qb]
	wantD := floats(raw[4+4*n+qb:])
	if len(wantD) != n {
		t.Fatalf("test data: %d dequantized values for %d", len(wantD), n)
	}
	got := make([]byte, qb)
	QuantizeRow(MXFP4, x, got)
	if !slices.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("byte %d (block %d): %#x, gguf-py writes %#x", i, i/BlockMXFP4, got[i], want[i])
			}
		}
	}
	d := make([]float32, n)
	DequantizeRow(MXFP4, want, d)
	for i := range d {
		if math.Float32bits(d[i]) != math.Float32bits(wantD[i]) {
			t.Fatalf("value %d: %g, gguf-py gives %g", i, d[i], wantD[i])
		}
	}
	if VecDotType(MXFP4) != Q8_0 || MXFP4.String() != "MXFP4" || MXFP4.RowSize(64) != 34 {
		t.Errorf("MXFP4: vec dot type %v, name %s, 64 values in %d bytes", VecDotType(MXFP4), MXFP4, MXFP4.RowSize(64))
	}
}
