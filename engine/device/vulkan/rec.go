package vulkan

import (
	"fmt"
	"math"

	"shoal/engine/device"
	"shoal/engine/device/cpu"
	"shoal/engine/device/vulkan/vk"
	"shoal/engine/quant"
)

// groups2 spreads n workgroups over two dimensions of at most 65535.
func groups2(n int) (uint32, uint32) {
	x := min(n, 65535)
	return uint32(max(x, 1)), uint32((n + x - 1) / max(x, 1))
}

// norm records dst[r] = RMSNorm(src[r]) · w for rows rows of width values.
func (r *Range) norm(cmd *vk.Cmd, src *vk.Buf, rows, width int, w vec, dst *vk.Buf) {
	gx, gy := groups2(rows)
	cmd.Dispatch(r.kernels.norm, gx, gy, 1,
		[]uint32{uint32(rows), uint32(width), 0, uint32(width), 0, uint32(width), uint32(w.off), math.Float32bits(r.sp.RMSEps)},
		vk.Whole(src), vk.Whole(r.vecs), vk.Whole(dst))
}

// add records y += a (the batch's rows of NEmbd) and the bias b when set.
func (r *Range) add(cmd *vk.Cmd, y, a *vk.Buf, b vec) {
	E := r.sp.NEmbd
	flags := uint32(1)
	if b.n > 0 {
		flags |= 2
	}
	r.addRows(cmd, y, r.n, E, E, a, b, flags, 1)
}

// addRows records y[i][j] += scale·a[i][j] (flags 1) + b[j] (flags 2) for
// rows of width values, stride apart in y and a.
func (r *Range) addRows(cmd *vk.Cmd, y *vk.Buf, rows, width, stride int, a *vk.Buf, b vec, flags uint32, scale float32) {
	r.addAt(cmd, y, 0, rows, width, stride, a, 0, b, flags, scale)
}

// addAt is addRows with the first row of y at float yoff and of a at aoff.
func (r *Range) addAt(cmd *vk.Cmd, y *vk.Buf, yoff, rows, width, stride int, a *vk.Buf, aoff int, b vec, flags uint32, scale float32) {
	if a == nil {
		a = y
	}
	cmd.Dispatch(r.kernels.add, uint32((width+63)/64), uint32(rows), 1,
		[]uint32{uint32(rows), uint32(width), uint32(yoff), uint32(stride), uint32(aoff), uint32(stride), uint32(b.off), flags, math.Float32bits(scale)},
		vk.Whole(y), vk.Whole(a), vk.Whole(r.vecs))
}

// rope records the rotation of the batch's heads in x (rows of width
// heads·HeadDim).
func (r *Range) rope(cmd *vk.Cmd, x *vk.Buf, heads int) {
	m := r.sp
	if heads == 0 || m.RopeDim == 0 {
		return
	}
	neox := uint32(0)
	if m.Rope == device.RopeNeoX {
		neox = 1
	}
	cmd.Dispatch(r.kernels.rope, uint32((m.RopeDim/2+63)/64), uint32(heads), uint32(r.n),
		[]uint32{uint32(r.n), uint32(heads), uint32(m.HeadDim), uint32(m.RopeDim), neox, 0, uint32(heads * m.HeadDim)},
		vk.Whole(x), vk.Whole(r.cs))
}

// recAttention records the attention half of layer l on x into out.
func (r *Range) recAttention(cmd *vk.Cmd, l int, w *layerW, x, out *vk.Buf) {
	n, E := r.n, r.sp.NEmbd
	r.recAttnCore(cmd, l, w, x)
	if w.wo == nil {
		cmd.Fill(out, 0, uint64(4*n*E), 0)
		return
	}
	r.mv(cmd, w.wo, Vec{B: r.att, Stride: r.qd}, n, Vec{B: out, Stride: E})
}

// recAttnCore records the attention half up to its output projection: the
// member's heads' attention in r.att.
func (r *Range) recAttnCore(cmd *vk.Cmd, l int, w *layerW, x *vk.Buf) {
	m, n, E := r.sp, r.n, r.sp.NEmbd
	r.norm(cmd, x, n, E, w.attnNorm, r.xn)
	if r.nh > 0 {
		D := m.HeadDim
		r.mvs(cmd, []*Matrix{w.wq, w.wk, w.wv}, Vec{B: r.xn, Stride: E}, n, []Vec{{B: r.q, Stride: r.qd}, {B: r.k, Stride: r.kvd}, {B: r.v, Stride: r.kvd}})
		for _, bb := range []struct {
			buf   *vk.Buf
			b     vec
			width int
		}{{r.q, w.bq, r.qd}, {r.k, w.bk, r.kvd}, {r.v, w.bv, r.kvd}} {
			if bb.b.n > 0 {
				r.addRows(cmd, bb.buf, n, bb.width, bb.width, nil, bb.b, 2, 1)
			}
		}
		if w.qnorm.n > 0 {
			r.norm(cmd, r.q, n*r.nh, D, w.qnorm, r.q)
			r.norm(cmd, r.k, n*r.nkv, D, w.knorm, r.k)
		}
		r.rope(cmd, r.q, r.nh)
		r.rope(cmd, r.k, r.nkv)
		kc, vc := r.store.k[l-r.ld.Lo], r.store.v[l-r.ld.Lo]
		cmd.Dispatch(r.kernels.kvstore, uint32((r.kvd/2+63)/64), uint32(n), 1,
			[]uint32{uint32(n), uint32(r.kvd), 0},
			vk.Whole(r.k), vk.Whole(r.v), vk.Whole(kc), vk.Whole(vc), vk.Whole(r.tok))
		p := &r.ld.Part
		cmd.Dispatch(r.kernels.attn, uint32(r.nh), uint32(n), 1,
			[]uint32{uint32(m.NHead / m.NHeadKV), uint32(p.HeadLo), uint32(p.KVLo), uint32(D), uint32(r.kvd),
				uint32(r.ld.KV.BlockSize), uint32(r.qd), uint32(n), math.Float32bits(float32(1 / math.Sqrt(float64(D))))},
			vk.Whole(r.q), vk.Whole(kc), vk.Whole(vc), vk.Whole(r.tok), vk.Whole(r.tab), vk.Whole(r.att))
	}
}

// recFFN records the dense FFN half on x into out.
func (r *Range) recFFN(cmd *vk.Cmd, w *layerW, x, out *vk.Buf) {
	n, E := r.n, r.sp.NEmbd
	r.norm(cmd, x, n, E, w.ffnNorm, r.xn)
	if w.gate == nil {
		cmd.Fill(out, 0, uint64(4*n*E), 0)
		return
	}
	r.swiglu(cmd, w.gate, w.up, w.down, Vec{B: r.xn, Stride: E}, n, Vec{B: out, Stride: E})
}

// swiglu records out = down(silu(gate·x) · up·x) for n vectors.
func (r *Range) swiglu(cmd *vk.Cmd, gate, up, down *Matrix, x Vec, n int, out Vec) {
	r.swigluIn(cmd, gate, up, x, n)
	r.mv(cmd, down, Vec{B: r.gb, Stride: gate.Rows}, n, out)
}

// swigluIn records r.gb = silu(gate·x) · up·x for n vectors ([n][gate.Rows]).
func (r *Range) swigluIn(cmd *vk.Cmd, gate, up *Matrix, x Vec, n int) {
	F := gate.Rows
	r.mvs(cmd, []*Matrix{gate, up}, x, n, []Vec{{B: r.gb, Stride: F}, {B: r.ub, Stride: F}})
	gx, gy := groups2((n*F + 63) / 64)
	cmd.Dispatch(r.kernels.silu, gx, gy, 1, []uint32{uint32(n * F)}, vk.Whole(r.gb), vk.Whole(r.ub))
}

// gathered finishes a half whose projection holds whole output rows: the
// members' inputs (in: this member's columns, [n][cols[rank]]) are
// all-gathered, this member's rows of w computed on the device, and the
// members' rows all-gathered into out, complete.
func (r *Range) gathered(w *Matrix, in []float32, cols []int, out []float32) error {
	coll, n := r.ld.Coll, r.n
	if coll == nil || len(cols) != coll.Size() || len(r.group.OutRows) != coll.Size() {
		return fmt.Errorf("vulkan: a gathered half without its group's widths")
	}
	total := 0
	for _, c := range cols {
		total += c
	}
	r.gfull = grow(r.gfull, n*total)
	if err := cpu.GatherRows(coll, in, n, cols, r.gfull, &r.gbuf); err != nil {
		return err
	}
	rows := r.group.OutRows[coll.Rank()]
	r.gpart = grow(r.gpart, n*rows)
	if w == nil {
		clear(r.gpart)
	} else {
		if w.Rows != rows || w.Cols != total {
			return fmt.Errorf("vulkan: a gathered projection of %d×%d for %d rows of %d columns", w.Rows, w.Cols, rows, total)
		}
		if err := r.ensure(&r.gx, 4*n*total); err != nil {
			return err
		}
		if err := r.ensure(&r.xq, 4*n*total); err != nil {
			return err
		}
		if err := r.ensure(&r.gy, 4*n*max(rows, 1)); err != nil {
			return err
		}
		err := r.run(r.gfull, r.gx, func(cmd *vk.Cmd) error {
			r.mv(cmd, w, Vec{B: r.gx, Stride: total}, n, Vec{B: r.gy, Stride: rows})
			return nil
		}, r.gy, r.gpart)
		if err != nil {
			return err
		}
	}
	return cpu.GatherRows(coll, r.gpart, n, r.group.OutRows, out, &r.gbuf)
}

// actMode is the quantact kernel's mode for the activations of a product
// with weights of type t: what the CPU rounds them to (quant.VecDotType).
func actMode(t quant.Type) uint32 {
	switch quant.VecDotType(t) {
	case quant.F16:
		return 1
	case quant.BF16:
		return 2
	case quant.Q8_0, quant.Q8_1:
		return 3
	case quant.Q8_K:
		return 4
	}
	return 0
}

// mv records y = W·x for n vectors, with x rounded first as the CPU
// rounds a product's activations (into r.xq), so that the device's
// products are the CPU's but for the order of the sums.
func (r *Range) mv(cmd *vk.Cmd, w *Matrix, x Vec, n int, y Vec) {
	r.mvs(cmd, []*Matrix{w}, x, n, []Vec{y})
}

// mvs is mv for matrices that take the same input, each rounding of x
// made once for the matrices after it that take it.
func (r *Range) mvs(cmd *vk.Cmd, ws []*Matrix, x Vec, n int, ys []Vec) {
	last := ^uint32(0)
	for i, w := range ws {
		mode := actMode(w.Type)
		if mode == 0 {
			w.MatVec(cmd, x, n, ys[i])
			continue
		}
		if mode != last {
			qk := 1 // values per rounding block: F16, BF16
			switch mode {
			case 3:
				qk = 32
			case 4:
				qk = 256
			}
			gx, gy := groups2((n*((w.Cols+qk-1)/qk) + 63) / 64)
			cmd.Dispatch(r.kernels.quant, gx, gy, 1, []uint32{uint32(n), uint32(w.Cols), uint32(x.Off), uint32(x.Stride), uint32(w.Cols), mode},
				vk.Whole(x.B), vk.Whole(r.xq))
			last = mode
		}
		w.MatVec(cmd, Vec{B: r.xq, Stride: w.Cols}, n, ys[i])
	}
}
