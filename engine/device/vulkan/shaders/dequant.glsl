// deq32(row, c, v): values [32c, 32c+32) of the row starting at byte row,
// for the weight format named by the FMT_ macro. QK is the values per
// block, BB its bytes; formats whose rows need not fill whole 32-value
// chunks (F32, F16, BF16) leave values past the row's end at zero (the
// caller passes cols).

#if defined(FMT_F32)
#define QK 1u
#define BB 4u
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    for (uint i = 0u; i < 32u; i++) {
        uint k = 32u * c + i;
        v[i] = k < cols ? uintBitsToFloat(wq[(row >> 2) + k]) : 0.0;
    }
}
#elif defined(FMT_F16)
#define QK 1u
#define BB 2u
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    for (uint i = 0u; i < 32u; i++) {
        uint k = 32u * c + i;
        v[i] = k < cols ? f16_at(row + 2u * k) : 0.0;
    }
}
#elif defined(FMT_BF16)
#define QK 1u
#define BB 2u
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    for (uint i = 0u; i < 32u; i++) {
        uint k = 32u * c + i;
        v[i] = k < cols ? uintBitsToFloat(u16_at(row + 2u * k) << 16) : 0.0;
    }
}
#elif defined(FMT_Q4_0)
#define QK 32u
#define BB 18u
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    uint b = row + c * BB;
    float d = f16_at(b);
    for (uint j = 0u; j < 16u; j += 4u) {
        uint q = u32_at(b + 2u + j);
        for (uint t = 0u; t < 4u; t++) {
            uint x = (q >> (8u * t)) & 0xFFu;
            v[j + t] = d * float(int(x & 15u) - 8);
            v[j + t + 16u] = d * float(int(x >> 4) - 8);
        }
    }
}
#elif defined(FMT_Q4_1) || defined(FMT_Q5_0) || defined(FMT_Q5_1)
#define QK 32u
#if defined(FMT_Q4_1)
#define BB 20u
#elif defined(FMT_Q5_0)
#define BB 22u
#else
#define BB 24u
#endif
// Q4_1: d, m, 16 bytes of nibbles; Q5_0: d, 4 bytes of fifth bits, the
// nibbles (minus 16); Q5_1: d, m, the fifth bits, the nibbles.
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    uint b = row + c * BB;
    float d = f16_at(b);
#if defined(FMT_Q5_0)
    float m = -16.0 * d;
    uint qh = u32_at(b + 2u), qs = b + 6u;
#elif defined(FMT_Q5_1)
    float m = f16_at(b + 2u);
    uint qh = u32_at(b + 4u), qs = b + 8u;
#else
    float m = f16_at(b + 2u);
    uint qh = 0u, qs = b + 4u;
#endif
    for (uint j = 0u; j < 16u; j += 4u) {
        uint q = u32_at(qs + j);
        for (uint t = 0u; t < 4u; t++) {
            uint x = (q >> (8u * t)) & 0xFFu;
            uint k = j + t;
            v[k] = d * float((x & 15u) | (((qh >> k) & 1u) << 4)) + m;
            v[k + 16u] = d * float((x >> 4) | (((qh >> (k + 16u)) & 1u) << 4)) + m;
        }
    }
}
#elif defined(FMT_Q8_0)
#define QK 32u
#define BB 34u
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    uint b = row + c * BB;
    float d = f16_at(b);
    for (uint j = 0u; j < 32u; j += 4u) {
        uint q = u32_at(b + 2u + j);
        for (uint t = 0u; t < 4u; t++) {
            v[j + t] = d * float(i8((q >> (8u * t)) & 0xFFu));
        }
    }
}
#elif defined(FMT_Q4_K) || defined(FMT_Q5_K)
#define QK 256u
#if defined(FMT_Q4_K)
#define BB 144u
#else
#define BB 176u
#endif
// the 6-bit scale and min of sub-block j from the 12 packed bytes at sc
void scale_min(uint sc, uint j, out float s, out float m) {
    if (j < 4u) {
        s = float(byte_at(sc + j) & 63u);
        m = float(byte_at(sc + j + 4u) & 63u);
    } else {
        s = float((byte_at(sc + j + 4u) & 15u) | ((byte_at(sc + j - 4u) >> 6) << 4));
        m = float((byte_at(sc + j + 4u) >> 4) | ((byte_at(sc + j) >> 6) << 4));
    }
}
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    uint b = row + (c >> 3) * BB;
    uint j = c & 7u;
    float s, m;
    scale_min(b + 4u, j, s, m);
    float d = f16_at(b) * s, dm = f16_at(b + 2u) * m;
#if defined(FMT_Q4_K)
    uint qs = b + 16u + 32u * (j >> 1);
#else
    uint qs = b + 48u + 32u * (j >> 1);
    uint qh = b + 16u;
#endif
    uint sh = 4u * (j & 1u);
    for (uint l = 0u; l < 32u; l += 4u) {
        uint q = u32_at(qs + l);
#if defined(FMT_Q5_K)
        uint h = u32_at(qh + l);
#endif
        for (uint t = 0u; t < 4u; t++) {
            uint x = (q >> (8u * t + sh)) & 15u;
#if defined(FMT_Q5_K)
            x |= ((h >> (8u * t + j)) & 1u) << 4;
#endif
            v[l + t] = d * float(x) - dm;
        }
    }
}
#elif defined(FMT_Q6_K)
#define QK 256u
#define BB 210u
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    uint b = row + (c >> 3) * BB;
    uint half_ = (c >> 2) & 1u, qq = c & 3u;
    uint ql = b + 64u * half_ + 32u * (qq & 1u);
    uint qh = b + 128u + 32u * half_;
    uint sc = b + 192u + 8u * half_ + 2u * qq;
    float d = f16_at(b + 208u);
    float d0 = d * float(i8(byte_at(sc))), d1 = d * float(i8(byte_at(sc + 1u)));
    uint lsh = 4u * (qq >> 1), hsh = 2u * qq;
    for (uint l = 0u; l < 32u; l += 4u) {
        uint lo = u32_at(ql + l), hi = u32_at(qh + l);
        for (uint t = 0u; t < 4u; t++) {
            int x = int(((lo >> (8u * t + lsh)) & 15u) | (((hi >> (8u * t + hsh)) & 3u) << 4)) - 32;
            v[l + t] = (l < 16u ? d0 : d1) * float(x);
        }
    }
}
#elif defined(FMT_IQ4_XS)
#define QK 256u
#define BB 136u
const float kv4[16] = float[16](-127., -104., -83., -65., -49., -35., -22., -10., 1., 13., 25., 38., 53., 69., 89., 113.);
void deq32(uint row, uint c, uint cols, inout float v[32]) {
    uint b = row + (c >> 3) * BB;
    uint ib = c & 7u;
    uint ls = ((byte_at(b + 4u + (ib >> 1)) >> (4u * (ib & 1u))) & 15u) | (((u16_at(b + 2u) >> (2u * ib)) & 3u) << 4);
    float dl = f16_at(b) * float(int(ls) - 32);
    uint qs = b + 8u + 16u * ib;
    for (uint j = 0u; j < 16u; j += 4u) {
        uint q = u32_at(qs + j);
        for (uint t = 0u; t < 4u; t++) {
            uint x = (q >> (8u * t)) & 0xFFu;
            v[j + t] = dl * kv4[x & 15u];
            v[j + t + 16u] = dl * kv4[x >> 4];
        }
    }
}
#else
#error "no FMT_ macro"
#endif
