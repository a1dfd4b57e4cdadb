#version 450
#extension GL_GOOGLE_include_directive : require
// Stores each token's K and V rows (kvd floats) in the F16 paged cache at
// the element tok[i] (its block's row for the token's slot).
layout(local_size_x = 64) in;
#include "half.glsl"
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) buffer KC { uint kc[]; };
layout(std430, binding = 3) buffer VC { uint vc[]; };
layout(std430, binding = 4) readonly buffer Tok { uint tok[]; };
layout(push_constant) uniform Push { uint rows, kvd, tokoff; } p;
void main() {
    uint q = gl_GlobalInvocationID.x, i = gl_GlobalInvocationID.y;
    if (2u * q >= p.kvd || i >= p.rows) {
        return;
    }
    uint src = i * p.kvd + 2u * q;
    uint dst = (tok[p.tokoff + i] + 2u * q) >> 1;
    kc[dst] = f2h(k[src]) | (f2h(k[src + 1u]) << 16);
    vc[dst] = f2h(v[src]) | (f2h(v[src + 1u]) << 16);
}
