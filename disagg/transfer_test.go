package disagg

import (
	"bytes"
	"testing"

	"shoal/engine/kv"
)

// TestTransferThroughFrames runs the documented flow without a network:
// two tensor-parallel prefill members (heads [0,2) and [2,4) of layers
// [0,4)) export each layer in chunks as frames; three decode members split
// differently (layers [0,2) heads [0,3), layers [0,2) heads [3,4), layers
// [2,4) all heads) take the layers they hold and the overlap of each
// frame's heads, import it, and check the end frame's totals. Every element
// must arrive where the source had it.
func TestTransferThroughFrames(t *testing.T) {
	const (
		headDim = 4
		prompt  = 37
		chunk   = 16
		id      = 77
	)
	type member struct {
		first, layers, headLo, headHi int
		c                             *kv.Cache
	}
	newMember := func(first, layers, lo, hi, blockSize int, seq kv.SeqID) *member {
		c, err := kv.New(kv.Config{FirstLayer: first, Layers: layers, KVDim: (hi - lo) * headDim, BlockSize: blockSize, NumBlocks: 8})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Reserve(seq, prompt); err != nil {
			t.Fatal(err)
		}
		return &member{first, layers, lo, hi, c}
	}
	prefill := []*member{newMember(0, 4, 0, 2, 16, 1), newMember(0, 4, 2, 4, 16, 1)}
	for _, m := range prefill {
		for l := 0; l < 4; l++ {
			for p := 0; p < prompt; p++ {
				k, v := m.c.K(l, m.c.Blocks(1), p), m.c.V(l, m.c.Blocks(1), p)
				for h := m.headLo; h < m.headHi; h++ {
					for d := 0; d < headDim; d++ {
						k[(h-m.headLo)*headDim+d] = layerStamp(false, l, p, h, d)
						v[(h-m.headLo)*headDim+d] = layerStamp(true, l, p, h, d)
					}
				}
			}
		}
	}
	decode := []*member{newMember(0, 2, 0, 3, 5, 9), newMember(0, 2, 3, 4, 5, 9), newMember(2, 2, 0, 4, 7, 9)}

	// Each prefill member writes its frames, layer after layer, then an end
	// frame, on one stream.
	streams := make([]bytes.Buffer, len(prefill))
	for i, m := range prefill {
		var tot Totals
		for l := 0; l < 4; l++ {
			for p := 0; p < prompt; p += chunk {
				n := min(chunk, prompt-p)
				k, v := make([]uint16, kv.RangeLen(n, 0, m.headHi-m.headLo, headDim)), make([]uint16, kv.RangeLen(n, 0, m.headHi-m.headLo, headDim))
				if err := m.c.ExportRange(1, l, p, n, 0, m.headHi-m.headLo, headDim, k, v); err != nil {
					t.Fatal(err)
				}
				f := &Frame{Kind: KindData, Transfer: id, Layer: l, Pos: p, Count: n, HeadLo: m.headLo, HeadHi: m.headHi, HeadDim: headDim, DType: F16}
				if err := f.SetKV(k, v); err != nil {
					t.Fatal(err)
				}
				if err := WriteFrame(&streams[i], f); err != nil {
					t.Fatal(err)
				}
				tot.Frames++
				tot.Bytes += uint64(len(f.Payload))
			}
		}
		tot.Layers, tot.Positions = 4, prompt
		if err := WriteFrame(&streams[i], EndFrame(id, tot)); err != nil {
			t.Fatal(err)
		}
	}

	// Each decode member reads every prefill member's stream.
	for di, m := range decode {
		for si := range streams {
			fr := NewFrameReader(bytes.NewReader(streams[si].Bytes()), 0)
			var got Totals
			for {
				f, err := fr.Read()
				if err != nil {
					t.Fatalf("decode member %d, stream %d: %v", di, si, err)
				}
				if f.Transfer != id {
					t.Fatalf("frame of transfer %d", f.Transfer)
				}
				if f.Kind == KindEnd {
					want, err := f.Totals()
					if err != nil || want.Frames != got.Frames || want.Bytes != got.Bytes {
						t.Fatalf("decode member %d, stream %d: took %+v, end frame says %+v (%v)", di, si, got, want, err)
					}
					break
				}
				got.Frames++
				got.Bytes += uint64(len(f.Payload))
				if f.Layer < m.first || f.Layer >= m.first+m.layers {
					continue
				}
				lo, hi, ok := f.Overlap(m.headLo, m.headHi)
				if !ok {
					continue
				}
				n := kv.RangeLen(f.Count, lo, hi, f.HeadDim)
				k, v := make([]uint16, n), make([]uint16, n)
				if err := f.DecodeHeads(lo, hi, k, v); err != nil {
					t.Fatal(err)
				}
				if err := m.c.ImportRange(9, f.Layer, f.Pos, f.Count, lo-m.headLo, hi-m.headLo, f.HeadDim, k, v); err != nil {
					t.Fatalf("decode member %d: import %v: %v", di, f, err)
				}
			}
		}
		for l := m.first; l < m.first+m.layers; l++ {
			for p := 0; p < prompt; p++ {
				k, v := m.c.K(l-m.first, m.c.Blocks(9), p), m.c.V(l-m.first, m.c.Blocks(9), p)
				for h := m.headLo; h < m.headHi; h++ {
					for d := 0; d < headDim; d++ {
						i := (h-m.headLo)*headDim + d
						if k[i] != layerStamp(false, l, p, h, d) || v[i] != layerStamp(true, l, p, h, d) {
							t.Fatalf("decode member %d layer %d pos %d head %d dim %d: k %#x v %#x", di, l, p, h, d, k[i], v[i])
						}
					}
				}
			}
		}
	}
}

// layerStamp is a distinct F16 bit pattern per element of layers [0,4),
// positions [0,64), heads [0,8) and dims [0,8).
func layerStamp(isV bool, layer, pos, head, d int) uint16 {
	x := uint16(layer<<12 | pos<<6 | head<<3 | d)
	if isV {
		x |= 0x8000
	}
	return x
}
