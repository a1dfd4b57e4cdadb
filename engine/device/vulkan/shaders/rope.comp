#version 450
// Rotates the first ropeDim dimensions of each head of x in place by the
// token's angles: cos at cs[i·half + j], sin at cs[rows·half + i·half + j].
// Pairs (2j, 2j+1), or (j, j+half) for NeoX.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer CS { float cs[]; };
layout(push_constant) uniform Push {
    uint rows, heads, headDim, ropeDim, neox, xoff, xstride;
} p;
void main() {
    uint half_ = p.ropeDim / 2u;
    uint j = gl_GlobalInvocationID.x, h = gl_GlobalInvocationID.y, i = gl_GlobalInvocationID.z;
    if (j >= half_ || h >= p.heads || i >= p.rows) {
        return;
    }
    uint base = p.xoff + i * p.xstride + h * p.headDim;
    uint ia = p.neox != 0u ? base + j : base + 2u * j;
    uint ib = p.neox != 0u ? base + j + half_ : base + 2u * j + 1u;
    float c = cs[i * half_ + j], s = cs[p.rows * half_ + i * half_ + j];
    float a = x[ia], b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = a * s + b * c;
}
