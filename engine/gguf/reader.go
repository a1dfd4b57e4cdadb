package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"unsafe"

	"shoal/engine/quant"
)

// File is a parsed GGUF file. Tensor data slices point into the mapping and
// stay valid until Close.
type File struct {
	Version    uint32
	KVs        []KV
	Tensors    []TensorInfo
	Alignment  uint64
	DataOffset uint64 // absolute offset of the data section

	kvIndex     map[string]int
	tensorIndex map[string]int
	data        []byte // the whole file
	unmap       func() error
	path        string
}

// FormatError is a problem in the file's bytes.
type FormatError struct {
	Path   string
	Offset uint64
	Msg    string
}

func (e *FormatError) Error() string {
	if e.Path != "" {
		return fmt.Sprintf("gguf %s: at offset %d: %s", e.Path, e.Offset, e.Msg)
	}
	return fmt.Sprintf("gguf: at offset %d: %s", e.Offset, e.Msg)
}

// Open maps path into memory and parses it.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("gguf %s: is a directory", path)
	}
	data, unmap, err := mapFile(fh, st.Size())
	if err != nil {
		return nil, fmt.Errorf("gguf %s: %w", path, err)
	}
	f, err := parse(data, path)
	if err != nil {
		unmap()
		return nil, err
	}
	f.unmap = unmap
	return f, nil
}

// Parse parses a GGUF image held in memory. The returned File refers to data.
func Parse(data []byte) (*File, error) { return parse(data, "") }

// Close releases the mapping. Tensor data must not be used afterwards.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	err := f.unmap()
	f.unmap = nil
	f.data = nil
	return err
}

// Path is the file's path ("" when parsed from memory).
func (f *File) Path() string { return f.path }

// Size is the size of the file in bytes.
func (f *File) Size() int64 { return int64(len(f.data)) }

type decoder struct {
	b    []byte
	off  uint64
	path string
}

func (d *decoder) fail(at uint64, format string, args ...any) error {
	return &FormatError{Path: d.path, Offset: at, Msg: fmt.Sprintf(format, args...)}
}

func (d *decoder) remaining() uint64 { return uint64(len(d.b)) - d.off }

func (d *decoder) need(n uint64, what string) error {
	if n > d.remaining() {
		return d.fail(d.off, "truncated: %s needs %d bytes, %d left in file", what, n, d.remaining())
	}
	return nil
}

func (d *decoder) u8(what string) (uint8, error) {
	if err := d.need(1, what); err != nil {
		return 0, err
	}
	v := d.b[d.off]
	d.off++
	return v, nil
}

func (d *decoder) u16(what string) (uint16, error) {
	if err := d.need(2, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint16(d.b[d.off:])
	d.off += 2
	return v, nil
}

func (d *decoder) u32(what string) (uint32, error) {
	if err := d.need(4, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v, nil
}

func (d *decoder) u64(what string) (uint64, error) {
	if err := d.need(8, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v, nil
}

func (d *decoder) str(what string) (string, error) {
	at := d.off
	n, err := d.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > d.remaining() {
		return "", d.fail(at, "%s length %d exceeds the %d bytes left in file", what, n, d.remaining())
	}
	s := string(d.b[d.off : d.off+n])
	d.off += n
	return s, nil
}

// count reads an element count and checks that count elements of at least
// minSize bytes each can fit in the rest of the file.
func (d *decoder) count(what string, minSize uint64) (uint64, error) {
	at := d.off
	n, err := d.u64(what)
	if err != nil {
		return 0, err
	}
	if minSize > 0 && n > d.remaining()/minSize {
		return 0, d.fail(at, "%s %d cannot fit in the %d bytes left in file", what, n, d.remaining())
	}
	return n, nil
}

func parse(data []byte, path string) (*File, error) {
	return parseSized(data, path, uint64(len(data)))
}

// ParseTable parses the header and tensor table of a GGUF file of size
// bytes from a prefix of it (the file's first bytes, at least up to the
// end of the tensor table): the tensors are checked against size, not
// against the prefix. The returned File has no tensor data (Data must not
// be called) and Size is the prefix's length. A prefix too short for the
// table fails with a FormatError; fetch more and try again.
func ParseTable(prefix []byte, size int64) (*File, error) {
	if size < int64(len(prefix)) {
		return nil, &FormatError{Msg: fmt.Sprintf("prefix of %d bytes is longer than the file's %d", len(prefix), size)}
	}
	return parseSized(prefix, "", uint64(size))
}

func parseSized(data []byte, path string, fileSize uint64) (*File, error) {
	d := &decoder{b: data, path: path}
	magic, err := d.u32("magic")
	if err != nil {
		return nil, err
	}
	if magic != Magic {
		return nil, d.fail(0, "bad magic %#08x, not a GGUF file", magic)
	}
	f := &File{data: data, path: path, Alignment: DefaultAlignment}
	if f.Version, err = d.u32("version"); err != nil {
		return nil, err
	}
	if f.Version != 2 && f.Version != 3 {
		return nil, d.fail(4, "unsupported GGUF version %d (want 2 or 3)", f.Version)
	}
	// A tensor info takes at least 8+4+8+4+8 bytes; a KV at least 8+4+1.
	nTensors, err := d.count("tensor count", 32)
	if err != nil {
		return nil, err
	}
	nKV, err := d.count("metadata count", 13)
	if err != nil {
		return nil, err
	}
	f.KVs = make([]KV, 0, nKV)
	f.kvIndex = make(map[string]int, nKV)
	for i := uint64(0); i < nKV; i++ {
		at := d.off
		key, err := d.str(fmt.Sprintf("metadata key %d", i))
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[key]; dup {
			return nil, d.fail(at, "duplicate metadata key %q", key)
		}
		tat := d.off
		t, err := d.u32("type of " + key)
		if err != nil {
			return nil, err
		}
		v, err := d.value(ValueType(t), key, tat, 0)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Type: ValueType(t), Value: v})
	}
	if kv, ok := f.kvIndex["general.alignment"]; ok {
		a, ok := toUint(f.KVs[kv].Value)
		if !ok || a == 0 || a&(a-1) != 0 || a > 1<<20 {
			return nil, d.fail(0, "general.alignment %v is not a power of two up to 1 MiB", f.KVs[kv].Value)
		}
		f.Alignment = a
	}
	f.Tensors = make([]TensorInfo, 0, nTensors)
	f.tensorIndex = make(map[string]int, nTensors)
	tensorAt := make([]uint64, 0, nTensors)
	for i := uint64(0); i < nTensors; i++ {
		at := d.off
		name, err := d.str(fmt.Sprintf("tensor %d name", i))
		if err != nil {
			return nil, err
		}
		if _, dup := f.tensorIndex[name]; dup {
			return nil, d.fail(at, "duplicate tensor name %q", name)
		}
		nd, err := d.u32("rank of " + name)
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > MaxDims {
			return nil, d.fail(at, "tensor %q has rank %d (want 1..%d)", name, nd, MaxDims)
		}
		dims := make([]uint64, nd)
		for j := range dims {
			if dims[j], err = d.u64("dimension of " + name); err != nil {
				return nil, err
			}
		}
		t, err := d.u32("type of " + name)
		if err != nil {
			return nil, err
		}
		off, err := d.u64("offset of " + name)
		if err != nil {
			return nil, err
		}
		size, err := tensorSize(quant.Type(t), dims)
		if err != nil {
			return nil, d.fail(at, "tensor %q: %v", name, err)
		}
		if off%f.Alignment != 0 {
			return nil, d.fail(at, "tensor %q data offset %d is not aligned to %d", name, off, f.Alignment)
		}
		f.tensorIndex[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, TensorInfo{Name: name, Dims: dims, Type: quant.Type(t), Offset: off, Size: size})
		tensorAt = append(tensorAt, at)
	}
	f.DataOffset = alignUp(d.off, f.Alignment)
	if f.DataOffset > fileSize && len(f.Tensors) > 0 {
		return nil, d.fail(d.off, "truncated: data section would start at %d, file is %d bytes", f.DataOffset, fileSize)
	}
	dataLen := uint64(0)
	if f.DataOffset < fileSize {
		dataLen = fileSize - f.DataOffset
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Offset > dataLen || t.Size > dataLen-t.Offset {
			return nil, d.fail(tensorAt[i], "tensor %q (%s, %d bytes at data offset %d) runs past the end of the file (data section holds %d bytes)", t.Name, t.Type, t.Size, t.Offset, dataLen)
		}
	}
	return f, nil
}

const maxArrayDepth = 4

func (d *decoder) value(t ValueType, key string, at uint64, depth int) (any, error) {
	switch t {
	case TypeUint8:
		return d.u8(key)
	case TypeInt8:
		v, err := d.u8(key)
		return int8(v), err
	case TypeUint16:
		return d.u16(key)
	case TypeInt16:
		v, err := d.u16(key)
		return int16(v), err
	case TypeUint32:
		return d.u32(key)
	case TypeInt32:
		v, err := d.u32(key)
		return int32(v), err
	case TypeFloat32:
		v, err := d.u32(key)
		return math.Float32frombits(v), err
	case TypeBool:
		v, err := d.u8(key)
		if err == nil && v > 1 {
			return nil, d.fail(d.off-1, "%s: bool byte %d is neither 0 nor 1", key, v)
		}
		return v == 1, err
	case TypeString:
		return d.str(key)
	case TypeUint64:
		return d.u64(key)
	case TypeInt64:
		v, err := d.u64(key)
		return int64(v), err
	case TypeFloat64:
		v, err := d.u64(key)
		return math.Float64frombits(v), err
	case TypeArray:
		return d.array(key, depth)
	}
	return nil, d.fail(at, "%s: unknown value type %d", key, uint32(t))
}

func (d *decoder) array(key string, depth int) (any, error) {
	if depth >= maxArrayDepth {
		return nil, d.fail(d.off, "%s: arrays nested deeper than %d", key, maxArrayDepth)
	}
	tat := d.off
	et32, err := d.u32(key + " element type")
	if err != nil {
		return nil, err
	}
	et := ValueType(et32)
	minSize := uint64(et.fixedSize())
	switch et {
	case TypeString, TypeArray:
		minSize = 8
	case TypeUint8, TypeInt8, TypeBool, TypeUint16, TypeInt16, TypeUint32, TypeInt32, TypeFloat32, TypeUint64, TypeInt64, TypeFloat64:
	default:
		return nil, d.fail(tat, "%s: unknown array element type %d", key, et32)
	}
	n, err := d.count(key+" array length", minSize)
	if err != nil {
		return nil, err
	}
	if fs := uint64(et.fixedSize()); fs > 0 && et != TypeBool {
		raw := d.b[d.off : d.off+n*fs]
		d.off += n * fs
		return decodeFixedArray(et, raw, int(n)), nil
	}
	switch et {
	case TypeBool:
		out := make([]bool, n)
		for i := range out {
			v, err := d.value(TypeBool, key, tat, depth)
			if err != nil {
				return nil, err
			}
			out[i] = v.(bool)
		}
		return out, nil
	case TypeString:
		out := make([]string, n)
		for i := range out {
			if out[i], err = d.str(key); err != nil {
				return nil, err
			}
		}
		return out, nil
	default: // arrays of arrays
		out := make([]any, n)
		for i := range out {
			if out[i], err = d.array(key, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
}

func decodeFixedArray(et ValueType, raw []byte, n int) any {
	le := binary.LittleEndian
	switch et {
	case TypeUint8:
		return append([]uint8(nil), raw...)
	case TypeInt8:
		return decodeLE(raw, n, 1, func(b []byte) int8 { return int8(b[0]) })
	case TypeUint16:
		return decodeLE(raw, n, 2, le.Uint16)
	case TypeInt16:
		return decodeLE(raw, n, 2, func(b []byte) int16 { return int16(le.Uint16(b)) })
	case TypeUint32:
		return decodeLE(raw, n, 4, le.Uint32)
	case TypeInt32:
		return decodeLE(raw, n, 4, func(b []byte) int32 { return int32(le.Uint32(b)) })
	case TypeFloat32:
		return decodeLE(raw, n, 4, func(b []byte) float32 { return math.Float32frombits(le.Uint32(b)) })
	case TypeUint64:
		return decodeLE(raw, n, 8, le.Uint64)
	case TypeInt64:
		return decodeLE(raw, n, 8, func(b []byte) int64 { return int64(le.Uint64(b)) })
	case TypeFloat64:
		return decodeLE(raw, n, 8, func(b []byte) float64 { return math.Float64frombits(le.Uint64(b)) })
	}
	panic("unreachable")
}

// decodeLE decodes n values of size bytes each from raw with get.
func decodeLE[T any](raw []byte, n, size int, get func([]byte) T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = get(raw[size*i:])
	}
	return out
}

// Lookup returns the metadata entry for key.
func (f *File) Lookup(key string) (KV, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return KV{}, false
	}
	return f.KVs[i], true
}

// Has reports whether key is present.
func (f *File) Has(key string) bool { _, ok := f.kvIndex[key]; return ok }

// String returns a string value.
func (f *File) String(key string) (string, bool) {
	kv, ok := f.Lookup(key)
	if !ok {
		return "", false
	}
	s, ok := kv.Value.(string)
	return s, ok
}

// Uint returns an integer value of any integer type that is non-negative.
func (f *File) Uint(key string) (uint64, bool) {
	kv, ok := f.Lookup(key)
	if !ok {
		return 0, false
	}
	return toUint(kv.Value)
}

// Int returns an integer value of any integer type.
func (f *File) Int(key string) (int64, bool) {
	kv, ok := f.Lookup(key)
	if !ok {
		return 0, false
	}
	switch v := kv.Value.(type) {
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	}
	u, ok := toUint(kv.Value)
	if !ok || u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// Float returns a numeric value as float64.
func (f *File) Float(key string) (float64, bool) {
	kv, ok := f.Lookup(key)
	if !ok {
		return 0, false
	}
	switch v := kv.Value.(type) {
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	if i, ok := f.Int(key); ok {
		return float64(i), true
	}
	return 0, false
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) {
	kv, ok := f.Lookup(key)
	if !ok {
		return false, false
	}
	b, ok := kv.Value.(bool)
	return b, ok
}

// Strings returns a string array.
func (f *File) Strings(key string) ([]string, bool) {
	kv, ok := f.Lookup(key)
	if !ok {
		return nil, false
	}
	s, ok := kv.Value.([]string)
	return s, ok
}

func toUint(v any) (uint64, bool) {
	switch v := v.(type) {
	case uint8:
		return uint64(v), true
	case uint16:
		return uint64(v), true
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	case int8:
		return uint64(v), v >= 0
	case int16:
		return uint64(v), v >= 0
	case int32:
		return uint64(v), v >= 0
	case int64:
		return uint64(v), v >= 0
	}
	return 0, false
}

// Tensor returns the info of the named tensor.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensorIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Data returns the bytes of t, a view into the mapped file.
func (f *File) Data(t *TensorInfo) []byte {
	start := f.DataOffset + t.Offset
	return f.data[start : start+t.Size : start+t.Size]
}

// Release drops from memory the pages of b, a part of f's tensor data that
// the caller has copied and will not read again (others may still read it:
// its bytes stay valid). It reports whether b is mapped from the file and
// its pages were dropped; when false (f parsed from memory, or not mapped
// on this platform) nothing was done.
func (f *File) Release(b []byte) bool {
	if f.unmap == nil || len(b) == 0 || len(f.data) == 0 {
		return false
	}
	base, p := uintptrOf(f.data), uintptrOf(b)
	if p < base || p+uintptr(len(b)) > base+uintptr(len(f.data)) {
		return false
	}
	return DropPages(b)
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// ParseHeader parses the metadata of a GGUF header held without its tensor
// data (such as the copy a shard file keeps): the tensor count is read as
// zero, so the key-value pairs are parsed and the tensor table is not. The
// returned File holds a copy of hdr and no tensors.
func ParseHeader(hdr []byte) (*File, error) {
	if len(hdr) < 24 {
		return nil, &FormatError{Offset: 0, Msg: fmt.Sprintf("header truncated: %d bytes", len(hdr))}
	}
	if string(hdr[:4]) != "GGUF" {
		return nil, &FormatError{Offset: 0, Msg: "bad magic: not a GGUF header"}
	}
	if v := binary.LittleEndian.Uint32(hdr[4:8]); v < 2 {
		return nil, &FormatError{Offset: 4, Msg: fmt.Sprintf("unsupported GGUF version %d", v)}
	}
	b := append([]byte(nil), hdr...)
	binary.LittleEndian.PutUint64(b[8:16], 0)
	return Parse(b)
}
