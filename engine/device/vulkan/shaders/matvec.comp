#version 450
#extension GL_GOOGLE_include_directive : require
// y[j][r] = W[r] · x[j] for the rows r of a weight matrix in one GGUF
// format and up to 8 activation vectors j: one workgroup per row, its
// threads taking 32-value chunks of the row in turn, the partial sums
// reduced in shared memory (any subgroup size).

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

#include "bytes.glsl"
#include "dequant.glsl"

layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint rows;     // rows of W to compute
    uint cols;     // values per row
    uint n;        // activation vectors (1..8)
    uint rowBytes; // bytes per row of W
    uint woff;     // byte offset of row 0 in the weight binding
    uint xoff;     // index of the first activation
    uint xstride;  // floats between activation vectors
    uint yoff;     // index of row 0's output
    uint ystride;  // floats between output vectors
} p;

shared float part[8][WG];

void main() {
    uint r = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    if (r >= p.rows) {
        return;
    }
    float acc[8] = float[8](0., 0., 0., 0., 0., 0., 0., 0.);
    uint row = p.woff + r * p.rowBytes;
    uint chunks = (p.cols + 31u) / 32u;
    float v[32];
    for (uint c = tid; c < chunks; c += WG) {
        deq32(row, c, p.cols, v);
        uint base = 32u * c;
        uint m = min(32u, p.cols - base);
        for (uint j = 0u; j < p.n; j++) {
            uint xb = p.xoff + j * p.xstride + base;
            float s = 0.0;
            for (uint i = 0u; i < m; i++) {
                s += v[i] * x[xb + i];
            }
            acc[j] += s;
        }
    }
    for (uint j = 0u; j < p.n; j++) {
        part[j][tid] = acc[j];
    }
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) {
            for (uint j = 0u; j < p.n; j++) {
                part[j][tid] += part[j][tid + s];
            }
        }
        barrier();
    }
    if (tid == 0u) {
        for (uint j = 0u; j < p.n; j++) {
            y[p.yoff + j * p.ystride + r] = part[j][0];
        }
    }
}
