#version 450
#extension GL_GOOGLE_include_directive : require
// Rounds activations as the CPU's products quantize them before a dot
// with a weight format (quant.VecDotType), writing the values the
// quantized activations stand for: mode 1 half precision (F16 weights),
// 2 bfloat16, 3 Q8_0/Q8_1 (32-value blocks, scale amax/127 stored as
// half, rounding half away from zero), 4 Q8_K (256-value blocks, scale
// -max/127 in float32, ties to even). One thread per block and vector.
layout(local_size_x = 64) in;
#include "half.glsl"
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n, cols, xoff, xstride, ystride, mode; } p;

uint bf16(float f) {
    uint u = floatBitsToUint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        return (u >> 16) | 64u; // quiet NaN
    }
    return (u + (0x7FFFu + ((u >> 16) & 1u))) >> 16;
}

void main() {
    uint qk = p.mode == 4u ? 256u : p.mode == 3u ? 32u : 1u;
    uint blocks = (p.cols + qk - 1u) / qk;
    uint id = gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u + gl_GlobalInvocationID.x;
    if (id >= p.n * blocks) {
        return;
    }
    uint j = id / blocks, b = id % blocks;
    uint xb = p.xoff + j * p.xstride + b * qk, yb = j * p.ystride + b * qk;
    uint m = min(qk, p.cols - b * qk);
    if (p.mode == 1u) {
        y[yb] = round16(x[xb]);
    } else if (p.mode == 2u) {
        y[yb] = uintBitsToFloat(bf16(x[xb]) << 16);
    } else if (p.mode == 3u) {
        float amax = 0.0;
        for (uint i = 0u; i < m; i++) {
            amax = max(amax, abs(x[xb + i]));
        }
        float d = amax / 127.0;
        float id_ = d != 0.0 ? 1.0 / d : 0.0;
        float dh = round16(d);
        for (uint i = 0u; i < m; i++) {
            float v = x[xb + i] * id_;
            y[yb + i] = sign(v) * floor(abs(v) + 0.5) * dh;
        }
    } else if (p.mode == 4u) {
        float amax = 0.0, mx = 0.0;
        for (uint i = 0u; i < m; i++) {
            float a = abs(x[xb + i]);
            if (amax < a) {
                amax = a;
                mx = x[xb + i];
            }
        }
        if (amax == 0.0) {
            for (uint i = 0u; i < m; i++) {
                y[yb + i] = 0.0;
            }
            return;
        }
        float iscale = -127.0 / mx;
        float d = 1.0 / iscale;
        for (uint i = 0u; i < m; i++) {
            y[yb + i] = min(127.0, roundEven(iscale * x[xb + i])) * d;
        }
    } else {
        for (uint i = 0u; i < m; i++) {
            y[yb + i] = x[xb + i];
        }
    }
}
