#version 450
#extension GL_GOOGLE_include_directive : require
// y[j][r] = W[r] · x[j] for the rows r of a weight matrix in one GGUF
// format and up to 8 activation vectors j. A workgroup of WG threads
// computes WG/tpr rows, tpr threads to a row taking its 32-value chunks in
// turn; the partial sums meet in shared memory after one barrier (any
// subgroup size), and the row's first thread adds them in order.

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
    uint tpr;      // threads per row, a power of two dividing WG
} p;

shared float part[8][WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint TPR = p.tpr;
    uint lane = tid % TPR;
    uint r = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * (WG / TPR) + tid / TPR;
    float acc[8] = float[8](0., 0., 0., 0., 0., 0., 0., 0.);
    if (r < p.rows) {
        uint row = p.woff + r * p.rowBytes;
        uint chunks = (p.cols + 31u) / 32u;
        float v[32];
        for (uint c = lane; c < chunks; c += TPR) {
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
    }
    for (uint j = 0u; j < p.n; j++) {
        part[j][tid] = acc[j];
    }
    barrier();
    if (r < p.rows && lane == 0u) {
        for (uint j = 0u; j < p.n; j++) {
            float s = 0.0;
            for (uint k = 0u; k < TPR; k++) {
                s += part[j][tid + k];
            }
            y[p.yoff + j * p.ystride + r] = s;
        }
    }
}
