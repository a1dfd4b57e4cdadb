package vulkan

import (
	"fmt"
	"math"

	"shoal/engine/device"
	"shoal/engine/device/cpu"
	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
)

// moeW is a layer's routed experts on the device (nil matrices for the
// experts another member holds) and the shared expert.
type moeW struct {
	router, shGateInp    *Matrix
	experts              [][3]*Matrix // gate, up, down
	shGate, shUp, shDown *Matrix
	maxF                 int
}

func (m *moeW) matrices() []*Matrix {
	if m == nil {
		return nil
	}
	out := []*Matrix{m.router, m.shGateInp, m.shGate, m.shUp, m.shDown}
	for _, e := range m.experts {
		out = append(out, e[:]...)
	}
	return out
}

// moeHost is the host's side of routing: the router's logits read back,
// the chosen experts and their weights.
type moeHost struct {
	route, shg []float32
	ids        []int32
	w          []float32
	idx        []int
}

func (r *Range) uploadMoE(ly *device.Layer) (*moeW, error) {
	mw := &moeW{}
	var err error
	up := func(dst **Matrix, src *kernels.Matrix) {
		if err == nil && src != nil {
			*dst, err = r.g.Upload(src)
			if err == nil && (*dst).Rows > mw.maxF && dst != &mw.router && dst != &mw.shGateInp {
				mw.maxF = max(mw.maxF, (*dst).Rows)
			}
		}
	}
	up(&mw.router, ly.Router)
	up(&mw.shGateInp, ly.ShGateInp)
	up(&mw.shGate, ly.ShGate)
	up(&mw.shUp, ly.ShUp)
	up(&mw.shDown, ly.ShDown)
	mw.experts = make([][3]*Matrix, len(ly.Experts))
	for e, ex := range ly.Experts {
		up(&mw.experts[e][0], ex.Gate)
		up(&mw.experts[e][1], ex.Up)
		up(&mw.experts[e][2], ex.Down)
		if ex.Gate != nil {
			mw.maxF = max(mw.maxF, ex.Gate.Rows)
		}
	}
	if mw.router == nil && err == nil {
		err = fmt.Errorf("a routed-expert layer without its router")
	}
	if mw.shGate != nil {
		mw.maxF = max(mw.maxF, mw.shGate.Rows)
	}
	r.maxF = max(r.maxF, mw.maxF)
	return mw, err
}

// moe runs the routed-expert FFN of a layer on x into out: the norm and
// the router (and the shared expert's gate) on the device, the softmax and
// the choice of experts on the host as the CPU makes them, then each
// token's experts and the weighted sum, in the CPU's order, on the device.
func (r *Range) moe(w *layerW, x, out []float32) error {
	m, n, E := r.sp, r.n, r.sp.NEmbd
	X, K := m.NExpert, m.NExpertUsed
	mw, h := w.moe, &r.moeHost
	h.route = grow(h.route, n*(X+1))
	err := r.run(x, r.x, func(cmd *vk.Cmd) error {
		r.norm(cmd, r.x, n, E, w.ffnNorm, r.xn)
		r.mv(cmd, mw.router, Vec{B: r.xn, Stride: E}, n, Vec{B: r.route, Stride: X})
		if mw.shGateInp != nil {
			r.mv(cmd, mw.shGateInp, Vec{B: r.xn, Stride: E}, n, Vec{B: r.route, Off: n * X, Stride: 1})
		}
		return nil
	}, r.route, h.route)
	if err != nil {
		return err
	}
	h.ids, h.w, h.idx = grow(h.ids, n*K), grow(h.w, n*K), grow(h.idx, X)
	for i := 0; i < n; i++ {
		p := h.route[i*X : (i+1)*X]
		cpu.Softmax(p)
		cpu.TopK(p, h.idx, K)
		var sum float32
		for j := 0; j < K; j++ {
			h.ids[i*K+j], h.w[i*K+j] = int32(h.idx[j]), p[h.idx[j]]
			sum += p[h.idx[j]]
		}
		if m.NormExperts {
			for j := 0; j < K; j++ {
				h.w[i*K+j] /= sum
			}
		}
	}
	cmd := r.g.ctx.Begin()
	cmd.Fill(r.o, 0, uint64(4*n*E), 0)
	for i := 0; i < n; i++ {
		for j := 0; j < K; j++ {
			ex := mw.experts[h.ids[i*K+j]]
			if ex[0] == nil {
				continue // held by another member
			}
			r.swiglu(cmd, ex[0], ex[1], ex[2], Vec{B: r.xn, Off: i * E, Stride: E}, 1, Vec{B: r.eo, Stride: E})
			r.addAt(cmd, r.o, i*E, 1, E, E, r.eo, 0, vec{}, 1, h.w[i*K+j])
		}
	}
	if m.SharedFFN && mw.shGate != nil && mw.shDown != nil {
		r.swiglu(cmd, mw.shGate, mw.shUp, mw.shDown, Vec{B: r.xn, Stride: E}, n, Vec{B: r.eo, Stride: E})
		for i := 0; i < n; i++ {
			gate := float32(1)
			if mw.shGateInp != nil {
				gate = 1 / (1 + float32(math.Exp(float64(-h.route[n*X+i]))))
			}
			r.addAt(cmd, r.o, i*E, 1, E, E, r.eo, i*E, vec{}, 1, gate)
		}
	}
	if err := cmd.Submit(); err != nil {
		return err
	}
	return r.o.Read(0, f32bytes(out))
}
