package quant

import "fmt"

// Type is a ggml tensor element type, numbered as in the GGUF format.
type Type uint32

const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q4_1 Type = 3
	Q5_0 Type = 6
	Q5_1 Type = 7
	Q8_0 Type = 8
	Q8_1 Type = 9
	Q2_K Type = 10
	Q3_K Type = 11
	Q4_K Type = 12
	Q5_K Type = 13
	Q6_K Type = 14
	Q8_K Type = 15
	// IQ2_XXS, IQ2_XS and IQ2_S: groups of 8 weights as points of a fixed
	// codebook, 2.06, 2.31 and 2.56 bits a weight.
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	// IQ3_XXS and IQ3_S: groups of 8 weights as two points of a fixed
	// codebook, 3.06 and 3.44 bits a weight.
	IQ3_XXS Type = 18
	// IQ1_S and IQ1_M: groups of 8 weights as points of a fixed ternary
	// codebook shifted by ±1/8, 1.56 and 1.75 bits a weight.
	IQ1_S Type = 19
	// IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table.
	IQ4_NL Type = 20
	IQ3_S  Type = 21
	IQ2_S  Type = 22
	IQ4_XS Type = 23
	I8     Type = 24
	I16    Type = 25
	I32    Type = 26
	I64    Type = 27
	F64    Type = 28
	IQ1_M  Type = 29
	BF16   Type = 30
)

// QK is the block length of the 32-element formats; QKK that of the K-quants.
const (
	QK  = 32
	QKK = 256
)

type typeInfo struct {
	name      string
	blockLen  int // elements per block
	blockSize int // bytes per block
}

// typeTable lists the layouts; types is the same indexed by Type, so the
// hot paths (RowSize, BlockLen) do an array load, not a map lookup.
var typeTable = map[Type]typeInfo{
	F32:     {"F32", 1, 4},
	F16:     {"F16", 1, 2},
	BF16:    {"BF16", 1, 2},
	F64:     {"F64", 1, 8},
	I8:      {"I8", 1, 1},
	I16:     {"I16", 1, 2},
	I32:     {"I32", 1, 4},
	I64:     {"I64", 1, 8},
	Q4_0:    {"Q4_0", QK, 2 + QK/2},
	Q4_1:    {"Q4_1", QK, 4 + QK/2},
	Q5_0:    {"Q5_0", QK, 2 + 4 + QK/2},
	Q5_1:    {"Q5_1", QK, 4 + 4 + QK/2},
	Q8_0:    {"Q8_0", QK, 2 + QK},
	Q8_1:    {"Q8_1", QK, 4 + QK},
	Q2_K:    {"Q2_K", QKK, QKK/16 + QKK/4 + 4},
	Q3_K:    {"Q3_K", QKK, QKK/8 + QKK/4 + 12 + 2},
	Q4_K:    {"Q4_K", QKK, 4 + 12 + QKK/2},
	Q5_K:    {"Q5_K", QKK, 4 + 12 + QKK/8 + QKK/2},
	Q6_K:    {"Q6_K", QKK, QKK/2 + QKK/4 + QKK/16 + 2},
	Q8_K:    {"Q8_K", QKK, 4 + QKK + QKK/16*2},
	IQ4_NL:  {"IQ4_NL", QK, 2 + QK/2},
	IQ4_XS:  {"IQ4_XS", QKK, 2 + 2 + QKK/64 + QKK/2},
	IQ2_XXS: {"IQ2_XXS", QKK, 2 + QKK/8*2},
	IQ2_XS:  {"IQ2_XS", QKK, 2 + QKK/8*2 + QKK/32},
	IQ2_S:   {"IQ2_S", QKK, 2 + QKK/4 + QKK/32 + QKK/32},
	IQ3_XXS: {"IQ3_XXS", QKK, 2 + 3*QKK/8},
	IQ3_S:   {"IQ3_S", QKK, 2 + QKK/4 + QKK/32 + QKK/8 + QKK/64},
	IQ1_S:   {"IQ1_S", QKK, 2 + QKK/8 + QKK/16},
	IQ1_M:   {"IQ1_M", QKK, QKK/8 + QKK/16 + QKK/32},
	MXFP4:   {"MXFP4", QK, BlockMXFP4},
}

var types = func() (a [MXFP4 + 1]typeInfo) {
	for t, ti := range typeTable {
		a[t] = ti
	}
	return a
}()

func info(t Type) (typeInfo, bool) {
	if int(t) < len(types) && types[t].blockLen > 0 {
		return types[t], true
	}
	return typeInfo{}, false
}

// Known reports whether shoal knows the layout of t.
func (t Type) Known() bool { _, ok := info(t); return ok }

func (t Type) String() string {
	if ti, ok := info(t); ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockLen is the number of elements in one block of t (1 for scalar types,
// 0 for an unknown type).
func (t Type) BlockLen() int { ti, _ := info(t); return ti.blockLen }

// BlockSize is the number of bytes in one block of t.
func (t Type) BlockSize() int { ti, _ := info(t); return ti.blockSize }

// RowSize is the number of bytes taken by n elements of type t. n must be a
// multiple of BlockLen (see CheckRow); an unknown type has size 0.
func (t Type) RowSize(n int) int {
	ti, ok := info(t)
	if !ok {
		return 0
	}
	return n / ti.blockLen * ti.blockSize
}

// CheckRow reports an error when a row of n elements cannot be stored as t.
func (t Type) CheckRow(n int) error {
	ti, ok := info(t)
	if !ok {
		return fmt.Errorf("unknown tensor type %d", uint32(t))
	}
	if n%ti.blockLen != 0 {
		return fmt.Errorf("%s row of %d elements is not a multiple of its block length %d", ti.name, n, ti.blockLen)
	}
	return nil
}

// ParseType maps a name such as "q4_k" or "F16" to its Type.
func ParseType(s string) (Type, error) {
	for t, ti := range typeTable {
		if equalFold(ti.name, s) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown tensor type %q", s)
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
