#version 450
// y[r] = x[r] / sqrt(mean(x[r]²) + eps) * w for rows of width values: one
// workgroup per row.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint rows, width, xoff, xstride, yoff, ystride, woff;
    float eps;
} p;
shared float part[WG];
void main() {
    uint r = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    if (r >= p.rows) {
        return;
    }
    uint xb = p.xoff + r * p.xstride, yb = p.yoff + r * p.ystride;
    float s = 0.0;
    for (uint j = tid; j < p.width; j += WG) {
        float v = x[xb + j];
        s += v * v;
    }
    part[tid] = s;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) {
            part[tid] += part[tid + h];
        }
        barrier();
    }
    float scale = 1.0 / sqrt(part[0] / float(p.width) + p.eps);
    barrier();
    for (uint j = tid; j < p.width; j += WG) {
        y[yb + j] = (x[xb + j] * scale) * w[p.woff + j];
    }
}
