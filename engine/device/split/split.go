package split

import (
	"fmt"

	"shoal/engine/device"
	"shoal/engine/kv"
)

// Device runs the first Layers layers of each range it loads on First and
// the others on Rest (all on one of them when the range falls on one side).
type Device struct {
	First, Rest device.Device
	// Layers is how many layers, counted from the range's first, First
	// holds.
	Layers int
}

// Name implements device.Device.
func (d Device) Name() string {
	return fmt.Sprintf("%s(%d layers)+%s", d.First.Name(), d.Layers, d.Rest.Name())
}

// Load implements device.Device.
func (d Device) Load(ld device.Load) (device.Range, error) {
	k := min(max(d.Layers, 0), ld.Hi-ld.Lo)
	if k == 0 {
		return d.Rest.Load(ld)
	}
	if k == ld.Hi-ld.Lo {
		return d.First.Load(ld)
	}
	mid := ld.Lo + k
	a, b := ld, ld
	a.Hi, a.Layers, a.OutputNorm, a.Output = mid, ld.Layers[:k], nil, nil
	a.KV.Layers = k
	b.Lo, b.Layers = mid, ld.Layers[k:]
	b.KV.FirstLayer, b.KV.Layers = ld.KV.FirstLayer+k, ld.Hi-mid
	ra, err := d.First.Load(a)
	if err != nil {
		return nil, fmt.Errorf("%s, layers [%d,%d): %w", d.First.Name(), a.Lo, a.Hi, err)
	}
	rb, err := d.Rest.Load(b)
	if err != nil {
		ra.Close()
		return nil, fmt.Errorf("%s, layers [%d,%d): %w", d.Rest.Name(), b.Lo, b.Hi, err)
	}
	return &Range{a: ra, b: rb, mid: mid, k: k, store: store{a: ra.KV(), b: rb.KV(), k: k}}, nil
}

// Range is a layer range split at mid between two devices' ranges.
type Range struct {
	a, b  device.Range
	mid   int
	k     int
	store store
}

// on returns the part holding layer l.
func (r *Range) on(l int) device.Range {
	if l < r.mid {
		return r.a
	}
	return r.b
}

// KV implements device.Range: local layers [0,k) are the first part's.
func (r *Range) KV() kv.Store { return r.store }

// SetGroup implements device.Range.
func (r *Range) SetGroup(g device.Group) {
	r.a.SetGroup(g)
	r.b.SetGroup(g)
}

// Begin implements device.Range.
func (r *Range) Begin(b *device.Batch) error {
	if err := r.a.Begin(b); err != nil {
		return err
	}
	return r.b.Begin(b)
}

// Attention implements device.Range.
func (r *Range) Attention(l int, x, out []float32) (bool, error) { return r.on(l).Attention(l, x, out) }

// FFN implements device.Range.
func (r *Range) FFN(l int, x, out []float32) (bool, error) { return r.on(l).FFN(l, x, out) }

// Residual implements device.Range.
func (r *Range) Residual(l int, h device.Half, x, out []float32) { r.on(l).Residual(l, h, x, out) }

// Forward implements device.Range: the first part's layers, then the
// rest's, on the same hidden states.
func (r *Range) Forward(lo, hi int, x []float32) error {
	if lo < r.mid {
		if err := r.a.Forward(lo, min(hi, r.mid), x); err != nil {
			return err
		}
	}
	if hi > r.mid {
		return r.b.Forward(max(lo, r.mid), hi, x)
	}
	return nil
}

// Logits implements device.Range: the output head is the second part's.
func (r *Range) Logits(x []float32, rows []int, out []float32) error {
	return r.b.Logits(x, rows, out)
}

// Hold implements device.Range.
func (r *Range) Hold() {
	r.a.Hold()
	r.b.Hold()
}

// Release implements device.Range.
func (r *Range) Release() {
	r.a.Release()
	r.b.Release()
}

// Close implements device.Range.
func (r *Range) Close() {
	r.a.Close()
	r.b.Close()
}

// store is the two parts' KV stores as one, by local layer index.
type store struct {
	a, b kv.Store
	k    int
}

func (s store) ReadRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	if layer < s.k {
		s.a.ReadRows(layer, block, slot, n, lo, hi, k, v)
	} else {
		s.b.ReadRows(layer-s.k, block, slot, n, lo, hi, k, v)
	}
}

func (s store) WriteRows(layer int, block int32, slot, n, lo, hi int, k, v []uint16) {
	if layer < s.k {
		s.a.WriteRows(layer, block, slot, n, lo, hi, k, v)
	} else {
		s.b.WriteRows(layer-s.k, block, slot, n, lo, hi, k, v)
	}
}
