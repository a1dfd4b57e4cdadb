#version 450
#extension GL_GOOGLE_include_directive : require
// Y[j][r] = W[r] · X[j] for a tile of 32 rows of W (one format) and 32
// activation vectors per workgroup, the prefill product: each 32-value
// step of the rows is dequantized once into shared memory for all 32
// vectors, and each of the 64 threads sums a 4×4 block of the tile.

layout(local_size_x = 64) in;

#include "bytes.glsl"
#include "dequant.glsl"

layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint rows, cols, n, rowBytes, woff, xoff, xstride, yoff, ystride;
} p;

const uint BM = 32u, BN = 32u;
shared float ws[BM][33];
shared float xs[BN][33];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r0 = gl_WorkGroupID.x * BM, c0 = gl_WorkGroupID.y * BN;
    uint tr = (tid % 8u) * 4u, tc = (tid / 8u) * 4u; // this thread's 4 rows and 4 vectors
    float acc[4][4];
    for (uint a = 0u; a < 4u; a++) {
        for (uint b = 0u; b < 4u; b++) {
            acc[a][b] = 0.0;
        }
    }
    uint chunks = (p.cols + 31u) / 32u;
    float v[32];
    for (uint c = 0u; c < chunks; c++) {
        uint base = 32u * c;
        if (tid < BM) {
            uint r = r0 + tid;
            if (r < p.rows) {
                deq32(p.woff + r * p.rowBytes, c, p.cols, v);
            } else {
                for (uint i = 0u; i < 32u; i++) {
                    v[i] = 0.0;
                }
            }
            for (uint i = 0u; i < 32u; i++) {
                ws[tid][i] = v[i];
            }
        } else {
            uint j = tid - BM, col = c0 + j;
            for (uint i = 0u; i < 32u; i++) {
                xs[j][i] = (col < p.n && base + i < p.cols) ? x[p.xoff + col * p.xstride + base + i] : 0.0;
            }
        }
        barrier();
        for (uint i = 0u; i < 32u; i++) {
            float wv[4], xv[4];
            for (uint a = 0u; a < 4u; a++) {
                wv[a] = ws[tr + a][i];
                xv[a] = xs[tc + a][i];
            }
            for (uint a = 0u; a < 4u; a++) {
                for (uint b = 0u; b < 4u; b++) {
                    acc[a][b] += wv[a] * xv[b];
                }
            }
        }
        barrier();
    }
    for (uint a = 0u; a < 4u; a++) {
        uint r = r0 + tr + a;
        for (uint b = 0u; b < 4u; b++) {
            uint col = c0 + tc + b;
            if (r < p.rows && col < p.n) {
                y[p.yoff + col * p.ystride + r] = acc[a][b];
            }
        }
    }
}
