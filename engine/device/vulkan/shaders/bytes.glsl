// Reading GGUF blocks from a buffer of 32-bit words: blocks are packed
// back to back, so a block's fields need not be 4-byte aligned.
layout(std430, binding = 0) readonly buffer Weights { uint wq[]; };

uint u32_at(uint o) {
    uint s = (o & 3u) * 8u;
    uint lo = wq[o >> 2];
    return s == 0u ? lo : (lo >> s) | (wq[(o >> 2) + 1u] << (32u - s));
}
uint byte_at(uint o) { return (wq[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
uint u16_at(uint o) { return (o & 1u) == 0u ? (wq[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu : byte_at(o) | (byte_at(o + 1u) << 8); }
float f16_at(uint o) { return unpackHalf2x16(u16_at(o)).x; }
int i8(uint b) { return int(b << 24) >> 24; }
