#version 450
// g = silu(g) · u elementwise, over count values.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };
layout(push_constant) uniform Push { uint count; } p;
void main() {
    uint i = gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u + gl_GlobalInvocationID.x;
    if (i >= p.count) {
        return;
    }
    float x = g[i];
    g[i] = x / (1.0 + exp(-x)) * u[i];
}
