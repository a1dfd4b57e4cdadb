package gguf

import (
	"fmt"
	"math"

	"shoal/engine/quant"
)

// Magic is "GGUF" read as a little-endian uint32.
const Magic = 0x46554747

// DefaultAlignment applies when general.alignment is absent.
const DefaultAlignment = 32

// MaxDims is the largest tensor rank ggml supports.
const MaxDims = 4

// ValueType is the type tag of a metadata value.
type ValueType uint32

// The tags are numbered 0 to 12 in this order, as the GGUF format has them.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("valuetype(%d)", uint32(t))
}

// fixedSize is the encoded size of a scalar value type, 0 for string/array.
func (t ValueType) fixedSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// KV is one metadata entry. Value holds the Go value for the type:
// uint8, int8, uint16, int16, uint32, int32, float32, bool, string, uint64,
// int64, float64, or for arrays a typed slice ([]uint8 … []string) or, for
// arrays of arrays, []any of those.
type KV struct {
	Key   string
	Type  ValueType
	Value any
}

// TensorInfo describes one tensor. Dims are in ggml order: Dims[0] is the
// contiguous (row) dimension.
type TensorInfo struct {
	Name   string
	Dims   []uint64
	Type   quant.Type
	Offset uint64 // from the start of the data section
	Size   uint64 // bytes
}

// Elements is the number of elements in the tensor.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Dim returns dimension i, or 1 past the tensor's rank.
func (t *TensorInfo) Dim(i int) int {
	if i < len(t.Dims) {
		return int(t.Dims[i])
	}
	return 1
}

// Rows is the number of rows (all dimensions but the first).
func (t *TensorInfo) Rows() int { return int(t.Elements() / t.Dims[0]) }

// RowSize is the byte size of one row.
func (t *TensorInfo) RowSize() int { return t.Type.RowSize(int(t.Dims[0])) }

// tensorSize computes the byte size of a tensor, checking for overflow and
// block alignment of the first dimension.
func tensorSize(typ quant.Type, dims []uint64) (uint64, error) {
	if !typ.Known() {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(typ))
	}
	n := uint64(1)
	for _, d := range dims {
		if d == 0 {
			return 0, nil
		}
		if d > math.MaxInt64/n {
			return 0, fmt.Errorf("dimensions %v overflow", dims)
		}
		n *= d
	}
	bl := uint64(typ.BlockLen())
	if len(dims) > 0 && dims[0]%bl != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of the %s block length %d", dims[0], typ, bl)
	}
	blocks := n / bl
	bs := uint64(typ.BlockSize())
	if blocks > math.MaxInt64/bs {
		return 0, fmt.Errorf("dimensions %v overflow", dims)
	}
	return blocks * bs, nil
}

func alignUp(x, a uint64) uint64 {
	if r := x % a; r != 0 {
		return x + a - r
	}
	return x
}
