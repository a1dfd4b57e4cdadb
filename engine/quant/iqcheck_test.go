package quant

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"testing"
)

// The checks the IQ1, IQ2 and IQ3 tests share.

// iqRef is a type with its plain reading.
type iqRef struct {
	typ Type
	ref func([]byte) []float32
}

// checkTable fails t unless raw, the table name with size-byte entries
// stored little-endian (size 4 or 8), has the SHA-256 sha and the entries
// spots.
func checkTable(t *testing.T, name string, raw []byte, size int, sha string, spots map[int]uint64) {
	t.Helper()
	sum := sha256.Sum256(raw)
	if got := hex.EncodeToString(sum[:]); got != sha {
		t.Errorf("%s SHA-256 %s, want %s", name, got, sha)
	}
	for i, want := range spots {
		got := uint64(binary.LittleEndian.Uint32(raw[size*i:]))
		if size == 8 {
			got = binary.LittleEndian.Uint64(raw[size*i:])
		}
		if got != want {
			t.Errorf("%s[%d] = %#0*x, want %#0*x", name, i, 2*size+2, got, 2*size+2, want)
		}
	}
}

// checkKeys fails t unless the codebook keys are increasing and each one
// is valid.
func checkKeys(t *testing.T, name string, keys []uint16, valid func(uint16) bool) {
	t.Helper()
	for i, k := range keys {
		if i > 0 && k <= keys[i-1] {
			t.Errorf("%s key %d (%d) not above key %d", name, i, k, i-1)
		}
		if !valid(k) {
			t.Errorf("%s key %d (%#x) out of range", name, i, k)
		}
	}
}

// noLevel3 is whether none of the eight 2-bit digits of k is 3.
func noLevel3(k uint16) bool {
	for j := 0; j < 8; j++ {
		if k>>(2*j)&3 == 3 {
			return false
		}
	}
	return true
}

// fuzzIQ checks one fuzz input against each of refs: the block data
// decodes as its plain reading says, and a row of the float32 values in
// data quantizes to blocks that decode to finite weights.
func fuzzIQ(t *testing.T, refs []iqRef, data []byte) {
	x := make([]float32, QKK)
	for i := range x {
		var w [4]byte
		copy(w[:], data[min(len(data), 4*i%max(1, len(data))):])
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(w[:]))
	}
	for _, c := range refs {
		blk := make([]byte, c.typ.BlockSize())
		copy(blk, data)
		got := make([]float32, QKK)
		DequantizeRow(c.typ, blk, got)
		want := c.ref(blk)
		for i := range want {
			if !sameBits(got[i], want[i]) {
				t.Fatalf("%v element %d = %g, want %g", c.typ, i, got[i], want[i])
			}
		}
		QuantizeRow(c.typ, x, blk)
		DequantizeRow(c.typ, blk, got)
		for i, v := range got {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%v quantized input % x: element %d decodes as %g", c.typ, data, i, v)
			}
		}
	}
}

// checkQuantSpecial quantizes rows of special float inputs (NaN,
// infinities, huge, tiny) with each of refs' types and fails t unless
// they decode to finite weights.
func checkQuantSpecial(t *testing.T, refs []iqRef) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for name, x := range map[string][]float32{
		"nan":    filled(QKK, 1, map[int]float32{3: nan}),
		"allnan": filled(QKK, nan, nil),
		"inf":    filled(QKK, 1, map[int]float32{200: -inf}),
		"huge":   filled(QKK, 3e38, map[int]float32{1: -3e38}),
		"tiny":   filled(QKK, 1e-30, nil),
		"mixed":  filled(QKK, 0, map[int]float32{0: 1e30, 100: 1e-30}),
	} {
		for _, c := range refs {
			blk := make([]byte, c.typ.BlockSize())
			QuantizeRow(c.typ, x, blk)
			y := make([]float32, QKK)
			DequantizeRow(c.typ, blk, y)
			for i, v := range y {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%v %s: element %d decodes as %g", c.typ, name, i, v)
				}
			}
		}
	}
}
