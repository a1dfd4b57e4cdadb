#version 450
#extension GL_GOOGLE_include_directive : require
// Attention over the paged F16 cache for one token and one query head per
// workgroup: softmax(q·K/√D)·V over positions [0, ctx). As the CPU does
// (and ggml with an F16 cache): the query rounded to half precision, the
// scores in float32, the probabilities rounded to half precision before
// they weigh V. Two passes over the keys: the max and the sum, then the
// probabilities and the weighted values (each thread owning dimensions).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
#include "half.glsl"
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer KC { uint kc[]; };
layout(std430, binding = 2) readonly buffer VC { uint vc[]; };
// per token: its context length, and where its block table starts in tab
layout(std430, binding = 3) readonly buffer Tok { uint tok[]; };
layout(std430, binding = 4) readonly buffer Tab { uint tab[]; };
layout(std430, binding = 5) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push {
    uint group;   // query heads per KV head in the model
    uint headLo;  // the member's first query head
    uint kvLo;    // the member's first KV head
    uint headDim;
    uint kvd;     // KV row width (held KV heads × headDim)
    uint bs;      // positions per block
    uint qd;      // query row width (held heads × headDim)
    uint tokoff;  // where this batch's entries start in tok (2 per token)
    float scale;
} p;

shared float qs[256];
shared float pr[WG];
shared float red[WG];
shared float red2[WG];

float f16(uint e, bool isK) {
    uint w = isK ? kc[e >> 1] : vc[e >> 1];
    return unpackHalf2x16((e & 1u) == 0u ? w : w >> 16).x;
}

uint row(uint t, uint toff) {
    return (tab[toff + t / p.bs] * p.bs + t % p.bs) * p.kvd;
}

void main() {
    uint h = gl_WorkGroupID.x, i = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint D = p.headDim;
    uint ctx = tok[p.tokoff + 2u * i], toff = tok[p.tokoff + 2u * i + 1u];
    uint kvh = (p.headLo + h) / p.group - p.kvLo;
    uint qb = i * p.qd + h * D;
    for (uint d = tid; d < D; d += WG) {
        qs[d] = round16(q[qb + d]);
    }
    barrier();
    // pass 1: each thread's running max and sum over its positions
    float m = -1.0 / 0.0, l = 0.0;
    for (uint t = tid; t < ctx; t += WG) {
        uint kb = row(t, toff) + kvh * D;
        float s = 0.0;
        for (uint d = 0u; d < D; d++) {
            s += qs[d] * f16(kb + d, true);
        }
        s *= p.scale;
        if (s > m) {
            l = l * exp(m - s) + 1.0;
            m = s;
        } else {
            l += exp(s - m);
        }
    }
    red[tid] = m;
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (tid < k) {
            red[tid] = max(red[tid], red[tid + k]);
        }
        barrier();
    }
    float mx = red[0];
    red2[tid] = l == 0.0 ? 0.0 : l * exp(m - mx);
    barrier();
    for (uint k = WG / 2u; k > 0u; k >>= 1) {
        if (tid < k) {
            red2[tid] += red2[tid + k];
        }
        barrier();
    }
    float inv = 1.0 / red2[0];
    // pass 2: probabilities of a tile of WG positions, then the values
    float acc[4] = float[4](0., 0., 0., 0.);
    for (uint t0 = 0u; t0 < ctx; t0 += WG) {
        barrier();
        uint t = t0 + tid;
        if (t < ctx) {
            uint kb = row(t, toff) + kvh * D;
            float s = 0.0;
            for (uint d = 0u; d < D; d++) {
                s += qs[d] * f16(kb + d, true);
            }
            pr[tid] = round16(exp(s * p.scale - mx) * inv);
        }
        barrier();
        uint n = min(WG, ctx - t0);
        for (uint j = 0u; j < n; j++) {
            uint vb = row(t0 + j, toff) + kvh * D;
            for (uint a = 0u; a < 4u; a++) {
                uint d = tid + a * WG;
                if (d < D) {
                    acc[a] += pr[j] * f16(vb + d, false);
                }
            }
        }
    }
    for (uint a = 0u; a < 4u; a++) {
        uint d = tid + a * WG;
        if (d < D) {
            o[qb + d] = acc[a];
        }
    }
}
