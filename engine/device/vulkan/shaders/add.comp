#version 450
// y[r][j] += scale·a[r][j] (when hasA) + b[j] (when hasB), for rows × width.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(push_constant) uniform Push {
    uint rows, width, yoff, ystride, aoff, astride, boff, flags; // flags: 1 a, 2 b
    float scale;
} p;
void main() {
    uint j = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y;
    if (j >= p.width || r >= p.rows) {
        return;
    }
    float v = 0.0;
    if ((p.flags & 1u) != 0u) {
        v += p.scale * a[p.aoff + r * p.astride + j];
    }
    if ((p.flags & 2u) != 0u) {
        v += b[p.boff + j];
    }
    y[p.yoff + r * p.ystride + j] += v;
}
