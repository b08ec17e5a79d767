# An independent int8 moment quantiser in numpy (rounding in the log domain, not by thresholds), for
# test_moment_codec: reads float32 x from argv[1], writes uint8 codes and float32 scales for
# signed (m) and unsigned (v) maps to argv[2] (codes_m, codes_v, scales_m, scales_v, concatenated).
import sys
import numpy as np

BLOCK, PER_OCTAVE = 256, 8


def quantise(x, levels, signed):
    n = x.size
    codes = np.zeros(n, np.uint8)
    scales = np.zeros((n + BLOCK - 1) // BLOCK, np.float32)
    for b in range(scales.size):
        blk = x[b * BLOCK:(b + 1) * BLOCK].astype(np.float64)
        scale = np.float32(np.max(np.abs(blk))) if blk.size else np.float32(0)
        scales[b] = scale
        if scale == 0:
            continue
        a = np.abs(blk) / np.float64(scale)
        with np.errstate(divide="ignore"):
            k = np.rint(levels + PER_OCTAVE * np.log2(a))
        k = np.clip(k, 1, levels)
        floor = 2.0 ** (-(levels - 1) / PER_OCTAVE)
        if signed:
            k = np.where(a < floor / 2, 0, k)
        else:
            k = np.where(a == 0, 0, k)
        k = k.astype(np.uint8)
        if signed:
            k = np.where((blk < 0) & (k > 0), k | 0x80, k).astype(np.uint8)
        codes[b * BLOCK:(b + 1) * BLOCK] = k
    return codes, scales


x = np.fromfile(sys.argv[1], dtype=np.float32)
cm, sm = quantise(x, 127, True)
cv, sv = quantise(np.abs(x), 255, False)
with open(sys.argv[2], "wb") as f:
    for a in (cm, cv, sm, sv):
        f.write(a.tobytes())
