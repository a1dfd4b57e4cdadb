// f2h converts a float to half-precision bits, rounding to nearest even as
// the engine's CPU code does (packHalf2x16's rounding is left to drivers).
uint f2h(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint e = (x >> 23) & 0xFFu;
    uint m = x & 0x7FFFFFu;
    if (e == 0xFFu) {
        return sign | 0x7C00u | (m != 0u ? 0x200u : 0u);
    }
    int ex = int(e) - 127 + 15;
    if (ex >= 31) {
        return sign | 0x7C00u;
    }
    if (ex <= 0) {
        if (ex < -10) {
            return sign;
        }
        m |= 0x800000u;
        uint shift = uint(14 - ex);
        uint h = m >> shift;
        uint rem = m & ((1u << shift) - 1u);
        uint halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u) != 0u)) {
            h++;
        }
        return sign | h;
    }
    uint h = sign | (uint(ex) << 10) | (m >> 13);
    uint rem = m & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) {
        h++;
    }
    return h;
}
float round16(float f) { return unpackHalf2x16(f2h(f)).x; }
