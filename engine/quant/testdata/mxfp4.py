# Writes mxfp4.bin: random rows at several scales and a row of exact levels, quantized to
# MXFP4 and dequantized by Debian's gguf-py (llama.cpp 0.7.0's), for TestMXFP4. Run inside
# ../shared/tools/llama-oracle: run python3 mxfp4.py OUT.bin
import sys, numpy as np
from gguf import quants, GGMLQuantizationType as Q
rng = np.random.default_rng(11)
blocks = []
for scale in [1e-3, 0.02, 0.5, 1, 3, 40, 1e4, 0]:
    blocks.append((rng.standard_normal(32) * scale).astype(np.float32))
blocks[-1][:] = 0
blocks.append(np.array([0.0, -0.0, 1, -1, 2, -2, 3, 6, 12, -12, 0.25, 0.75, 1.25, 5, 7, 10] * 2, dtype=np.float32))
x = np.concatenate(blocks).astype(np.float32)
q = quants.quantize(x.reshape(1, -1), Q.MXFP4)
d = quants.dequantize(q, Q.MXFP4).astype(np.float32)
with open(sys.argv[1], "wb") as f:
    f.write(np.uint32(x.size).tobytes()); f.write(x.tobytes()); f.write(q.tobytes()); f.write(d.tobytes())
print(x.size, q.size, d.size)
