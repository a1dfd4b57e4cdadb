package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"reflect"

	"shoal/engine/quant"
)

// Writer writes a GGUF v3 file: metadata and tensor infos first (WriteHeader),
// then each tensor's data in the order the tensors were added.
type Writer struct {
	w         *bufio.Writer
	kvs       []KV
	tensors   []TensorInfo
	alignment uint64
	next      int    // index of the next tensor whose data is expected
	written   uint64 // bytes written so far
	header    bool
	err       error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 1<<20), alignment: DefaultAlignment}
}

// AddKV adds a metadata entry. The value type follows the Go type: uint8,
// int8, uint16, int16, uint32, int32, float32, bool, string, uint64, int64,
// float64, or a slice of one of those. general.alignment (uint32) changes the
// data alignment.
func (w *Writer) AddKV(key string, value any) error {
	t, err := valueTypeOf(value)
	if err != nil {
		return fmt.Errorf("gguf: metadata %q: %w", key, err)
	}
	for _, kv := range w.kvs {
		if kv.Key == key {
			return fmt.Errorf("gguf: duplicate metadata key %q", key)
		}
	}
	if key == "general.alignment" {
		a, ok := toUint(value)
		if !ok || a == 0 || a&(a-1) != 0 {
			return fmt.Errorf("gguf: general.alignment must be a power of two, got %v", value)
		}
		w.alignment = a
	}
	w.kvs = append(w.kvs, KV{Key: key, Type: t, Value: value})
	return nil
}

// AddTensor declares a tensor (ggml dim order: dims[0] is the row length).
func (w *Writer) AddTensor(name string, typ quant.Type, dims ...uint64) error {
	if w.header {
		return fmt.Errorf("gguf: AddTensor %q after WriteHeader", name)
	}
	if len(dims) == 0 || len(dims) > MaxDims {
		return fmt.Errorf("gguf: tensor %q has rank %d (want 1..%d)", name, len(dims), MaxDims)
	}
	for _, t := range w.tensors {
		if t.Name == name {
			return fmt.Errorf("gguf: duplicate tensor %q", name)
		}
	}
	size, err := tensorSize(typ, dims)
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	off := uint64(0)
	if n := len(w.tensors); n > 0 {
		last := w.tensors[n-1]
		off = alignUp(last.Offset+last.Size, w.alignment)
	}
	w.tensors = append(w.tensors, TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: typ, Offset: off, Size: size})
	return nil
}

// WriteHeader writes the header, metadata and tensor infos.
func (w *Writer) WriteHeader() error {
	if w.header {
		return fmt.Errorf("gguf: header already written")
	}
	w.header = true
	w.u32(Magic)
	w.u32(3)
	w.u64(uint64(len(w.tensors)))
	w.u64(uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		w.str(kv.Key)
		w.u32(uint32(kv.Type))
		w.value(kv.Value)
	}
	for _, t := range w.tensors {
		w.str(t.Name)
		w.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w.u64(d)
		}
		w.u32(uint32(t.Type))
		w.u64(t.Offset)
	}
	w.pad()
	return w.err
}

// WriteTensor writes the data of the next declared tensor, which must be name.
func (w *Writer) WriteTensor(name string, data []byte) error {
	if !w.header {
		if err := w.WriteHeader(); err != nil {
			return err
		}
	}
	if w.next >= len(w.tensors) {
		return fmt.Errorf("gguf: WriteTensor %q: all tensors already written", name)
	}
	t := w.tensors[w.next]
	if t.Name != name {
		return fmt.Errorf("gguf: WriteTensor %q: expected tensor %q next", name, t.Name)
	}
	if uint64(len(data)) != t.Size {
		return fmt.Errorf("gguf: tensor %q: %d bytes given, %s%v takes %d", name, len(data), t.Type, t.Dims, t.Size)
	}
	w.next++
	w.bytes(data)
	w.pad()
	return w.err
}

// Close flushes the output; every declared tensor must have been written.
func (w *Writer) Close() error {
	if !w.header {
		if err := w.WriteHeader(); err != nil {
			return err
		}
	}
	if w.next != len(w.tensors) {
		return fmt.Errorf("gguf: %d of %d tensors written", w.next, len(w.tensors))
	}
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

func (w *Writer) bytes(b []byte) {
	if w.err != nil {
		return
	}
	_, w.err = w.w.Write(b)
	w.written += uint64(len(b))
}

func (w *Writer) pad() {
	if n := alignUp(w.written, w.alignment) - w.written; n > 0 {
		w.bytes(make([]byte, n))
	}
}

func (w *Writer) u32(v uint32) { w.bytes(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *Writer) u64(v uint64) { w.bytes(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *Writer) str(s string) { w.u64(uint64(len(s))); w.bytes([]byte(s)) }

func (w *Writer) value(v any) {
	le := binary.LittleEndian
	switch v := v.(type) {
	case uint8:
		w.bytes([]byte{v})
	case int8:
		w.bytes([]byte{byte(v)})
	case bool:
		if v {
			w.bytes([]byte{1})
		} else {
			w.bytes([]byte{0})
		}
	case uint16:
		w.bytes(le.AppendUint16(nil, v))
	case int16:
		w.bytes(le.AppendUint16(nil, uint16(v)))
	case uint32:
		w.u32(v)
	case int32:
		w.u32(uint32(v))
	case float32:
		w.u32(math.Float32bits(v))
	case uint64:
		w.u64(v)
	case int64:
		w.u64(uint64(v))
	case float64:
		w.u64(math.Float64bits(v))
	case string:
		w.str(v)
	default:
		// A slice of one of the types above, as valueTypeOf checked.
		rv := reflect.ValueOf(v)
		et, _ := valueTypeOf(reflect.Zero(rv.Type().Elem()).Interface())
		w.u32(uint32(et))
		w.u64(uint64(rv.Len()))
		for i := range rv.Len() {
			w.value(rv.Index(i).Interface())
		}
	}
}

func valueTypeOf(v any) (ValueType, error) {
	switch v.(type) {
	case uint8:
		return TypeUint8, nil
	case int8:
		return TypeInt8, nil
	case uint16:
		return TypeUint16, nil
	case int16:
		return TypeInt16, nil
	case uint32:
		return TypeUint32, nil
	case int32:
		return TypeInt32, nil
	case float32:
		return TypeFloat32, nil
	case bool:
		return TypeBool, nil
	case string:
		return TypeString, nil
	case uint64:
		return TypeUint64, nil
	case int64:
		return TypeInt64, nil
	case float64:
		return TypeFloat64, nil
	case []uint8, []int8, []uint16, []int16, []uint32, []int32, []float32, []bool, []string, []uint64, []int64, []float64:
		return TypeArray, nil
	}
	return 0, fmt.Errorf("unsupported value type %T", v)
}
