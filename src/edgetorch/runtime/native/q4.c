/* edgetorch's native int4 kernels (the portable backend's edgetorch::linear_q4), built on first use by
 * edgetorch.runtime.native with the machine's C compiler (-O3 -march=native -fopenmp) and called through ctypes.
 *
 * Weight layout (edgetorch.runtime.lowbit): uint8 [N, K/2]; byte j of row n holds q[n, 2j] + 8 in its low nibble
 * and q[n, 2j+1] + 8 in its high nibble. Scales: bfloat16 bits [N, K/group]. w[n, k] = q[n, k] * s[n, k/group].
 *
 * The caller (Python) checks every shape, dtype and contiguity before calling: these functions trust their
 * arguments. They use the process's OpenMP runtime: torch's libgomp (same soname, already loaded by torch), so
 * they share torch's thread pool instead of starting a second one.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define Q4_AVX512 1
#endif

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch's float -> bfloat16 conversion (the inputs here are finite). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Walks the scale index of consecutive 32-column chunks without a division per chunk (group % 32 == 0). */
typedef struct { int64_t index, left, per; } chunk_scales;

static inline chunk_scales chunk_scales_start(int64_t group) {
    chunk_scales c = {0, group / 32, group / 32};
    return c;
}

static inline int64_t chunk_scales_next(chunk_scales *c) {
    const int64_t i = c->index;
    if (--c->left == 0) {
        c->index++;
        c->left = c->per;
    }
    return i;
}

int q4_has_avx512(void) {
#ifdef Q4_AVX512
    return 1;
#else
    return 0;
#endif
}

/* One row, generic C: out[k] = bf16((nibble - 8) * s). */
static void dequant_row_generic(const uint8_t *w, const uint16_t *s, int64_t k, int64_t group, uint16_t *out) {
    for (int64_t j = 0; j < k / 2; j++) {
        float s0 = bf16_to_f32(s[(2 * j) / group]);
        float s1 = bf16_to_f32(s[(2 * j + 1) / group]);
        out[2 * j] = f32_to_bf16((float)((int)(w[j] & 15) - 8) * s0);
        out[2 * j + 1] = f32_to_bf16((float)((int)(w[j] >> 4) - 8) * s1);
    }
}

#ifdef Q4_AVX512
/* 16 packed bytes (32 weights, one scale) -> two vectors of 16 floats, (nibble - 8), in k order. */
static inline void unpack32(const uint8_t *w, __m512 *first, __m512 *second) {
    const __m128i b = _mm_loadu_si128((const __m128i *)w);
    const __m128i mask = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m512i eight = _mm512_set1_epi32(8);
    __m512i a = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), eight);
    __m512i c = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), eight);
    *first = _mm512_cvtepi32_ps(a);
    *second = _mm512_cvtepi32_ps(c);
}

static inline __m256i to_bf16(__m512 v) {
#ifdef __AVX512BF16__
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
#endif
}

static void dequant_row_avx512(const uint8_t *w, const uint16_t *s, int64_t k, int64_t group, uint16_t *out) {
    chunk_scales cs = chunk_scales_start(group);
    for (int64_t k0 = 0; k0 < k; k0 += 32) {
        __m512 a, c;
        unpack32(w + k0 / 2, &a, &c);
        const __m512 scale = _mm512_set1_ps(bf16_to_f32(s[chunk_scales_next(&cs)]));
        _mm256_storeu_si256((__m256i *)(out + k0), to_bf16(_mm512_mul_ps(a, scale)));
        _mm256_storeu_si256((__m256i *)(out + k0 + 16), to_bf16(_mm512_mul_ps(c, scale)));
    }
}
#endif

/* The weight in bfloat16 bits, out[r * k + c] = bf16(q[r, c] * s[r, c / group]): the same bits as
 * torch's (nibble.to(bf16) - 8) * scale in bfloat16 arithmetic (the product is exact in float32). */
void q4_dequant_bf16(const uint8_t *w, const uint16_t *s, int64_t n, int64_t k, int64_t group, uint16_t *out,
                     int threads) {
    const int fast = (k % 32 == 0) && (group % 32 == 0);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *wr = w + r * (k / 2);
        const uint16_t *sr = s + r * (k / group);
#ifdef Q4_AVX512
        if (fast) {
            dequant_row_avx512(wr, sr, k, group, out + r * k);
            continue;
        }
#endif
        (void)fast;
        dequant_row_generic(wr, sr, k, group, out + r * k);
    }
}

/* y[m, n] = sum_k x[m, k] * w[n, k] for m < rows (float32 x [rows, k], y [rows, n]), straight from the packed
 * bytes: each weight is unpacked once per call and used for every row of x. */
static void gemv_row_generic(const float *x, int64_t rows, const uint8_t *w, const uint16_t *s, int64_t k,
                             int64_t group, float *y, int64_t ldy) {
    for (int64_t m = 0; m < rows; m++) {
        const float *xm = x + m * k;
        float acc = 0.0f;
        for (int64_t g0 = 0; g0 < k; g0 += group) {
            float part = 0.0f;
            for (int64_t kk = g0; kk < g0 + group; kk += 2) {
                const uint8_t b = w[kk / 2];
                part += xm[kk] * (float)((int)(b & 15) - 8) + xm[kk + 1] * (float)((int)(b >> 4) - 8);
            }
            acc += part * bf16_to_f32(s[g0 / group]);
        }
        y[m * ldy] = acc;
    }
}

#ifdef Q4_AVX512
#define Q4_MAX_ROWS 4
static void gemv_row_avx512(const float *x, int64_t rows, const uint8_t *w, const uint16_t *s, int64_t k,
                            int64_t group, float *y, int64_t ldy) {
    for (int64_t m0 = 0; m0 < rows; m0 += Q4_MAX_ROWS) {
        const int64_t mr = rows - m0 < Q4_MAX_ROWS ? rows - m0 : Q4_MAX_ROWS;
        __m512 acc[Q4_MAX_ROWS], acc2[Q4_MAX_ROWS];
        for (int64_t m = 0; m < mr; m++) acc[m] = acc2[m] = _mm512_setzero_ps();
        chunk_scales cs = chunk_scales_start(group);
        for (int64_t k0 = 0; k0 < k; k0 += 32) {
            __m512 a, c;
            unpack32(w + k0 / 2, &a, &c);
            const __m512 scale = _mm512_set1_ps(bf16_to_f32(s[chunk_scales_next(&cs)]));
            a = _mm512_mul_ps(a, scale);
            c = _mm512_mul_ps(c, scale);
            for (int64_t m = 0; m < mr; m++) {
                const float *xm = x + (m0 + m) * k + k0;
                acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xm), a, acc[m]);
                acc2[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xm + 16), c, acc2[m]);
            }
        }
        for (int64_t m = 0; m < mr; m++) y[(m0 + m) * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m], acc2[m]));
    }
}
#endif

#ifdef Q4_AVX512
/* One row of x, four weight rows at a time (shared activation loads, four independent chains). */
static void gemv4_f32_m1(const float *x, const uint8_t *w, const uint16_t *s, int64_t k, int64_t group,
                         float *y) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    chunk_scales cs = chunk_scales_start(group);
    for (int64_t k0 = 0; k0 < k; k0 += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + k0), x1 = _mm512_loadu_ps(x + k0 + 16);
        const int64_t si = chunk_scales_next(&cs);
        for (int j = 0; j < 4; j++) {
            __m512 a, c;
            unpack32(w + j * (k / 2) + k0 / 2, &a, &c);
            const __m512 part = _mm512_fmadd_ps(x1, c, _mm512_mul_ps(x0, a));
            acc[j] = _mm512_fmadd_ps(part, _mm512_set1_ps(bf16_to_f32(s[j * (k / group) + si])), acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) y[j] = _mm512_reduce_add_ps(acc[j]);
}
#endif

void q4_gemv_f32(const float *x, int64_t rows, const uint8_t *w, const uint16_t *s, int64_t n, int64_t k,
                 int64_t group, float *y, int threads) {
    const int fast = (k % 32 == 0) && (group % 32 == 0);
#ifdef Q4_AVX512
    if (fast && rows == 1) {
        const int64_t quads = n / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t q = 0; q < quads; q++)
            gemv4_f32_m1(x, w + 4 * q * (k / 2), s + 4 * q * (k / group), k, group, y + 4 * q);
        for (int64_t r = 4 * quads; r < n; r++)
            gemv_row_avx512(x, 1, w + r * (k / 2), s + r * (k / group), k, group, y + r, n);
        return;
    }
#endif
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *wr = w + r * (k / 2);
        const uint16_t *sr = s + r * (k / group);
#ifdef Q4_AVX512
        if (fast) {
            gemv_row_avx512(x, rows, wr, sr, k, group, y + r, n);
            continue;
        }
#endif
        (void)fast;
        gemv_row_generic(x, rows, wr, sr, k, group, y + r, n);
    }
}

/* ---- 8-bit dynamic activations (8da4w) with VNNI -------------------------------------------------------------
 * torchao's int8 asymmetric per-token quantization, the same float32 arithmetic as edgetorch.runtime.lowbit's
 * quantize_per_token: scale = max((max(mx, 0) - min(mn, 0)) / 255, FLT_MIN), zp = clamp(-128 - rint(min / scale),
 * -128, 127), q = clamp(rint(x * (1 / scale)) + zp, -128, 127). Stored as u = q + 128 (unsigned), rearranged per
 * 128 columns: the 64 even columns, then the 64 odd ones (the order of the packed weight's low and high nibbles),
 * so a 64-byte load of weights pairs with two 64-byte loads of activations. Returns 0, or 1 when a row holds a NaN
 * or an infinity (the caller then uses the float path, which propagates them as torchao does). */
/* One row's min and max; 1 when it holds a NaN or an infinity. */
static int row_min_max(const float *xm, int64_t k, float *mn_out, float *mx_out) {
    float mn = INFINITY, mx = -INFINITY; /* no read outside the row, even for k == 0 (Python never passes it) */
    int bad = 0;
    for (int64_t i = 0; i < k; i++) {
        const float v = xm[i];
        bad |= !(v - v == 0.0f);
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    *mn_out = mn;
    *mx_out = mx;
    return bad;
}

/* torchao's scale, 1 / scale and zero point of a row from its min and max (float32 throughout). */
static void token_qparams(float mn, float mx, float *scale, float *inv, float *zp) {
    const float min_neg = mn < 0.0f ? mn : 0.0f, max_pos = mx > 0.0f ? mx : 0.0f;
    float s = (max_pos - min_neg) / 255.0f;
    if (s < 1.17549435e-38f) s = 1.17549435e-38f;
    float z = -128.0f - rintf(min_neg / s);
    *zp = z < -128.0f ? -128.0f : (z > 127.0f ? 127.0f : z);
    *scale = s;
    *inv = 1.0f / s;
}

int q8_quantize_rows(const float *x, int64_t rows, int64_t k, uint8_t *xu, float *scale_out, float *zp128_out) {
    for (int64_t m = 0; m < rows; m++) {
        const float *xm = x + m * k;
        float mn, mx, scale, inv, zp;
        if (row_min_max(xm, k, &mn, &mx)) return 1;
        token_qparams(mn, mx, &scale, &inv, &zp);
        const float lo = -128.0f - zp, hi = 127.0f - zp;
        uint8_t *um = xu + m * k;
        for (int64_t i = 0; i < k; i++) {
            float c = rintf(xm[i] * inv);
            c = c < lo ? lo : (c > hi ? hi : c);
            const int64_t j = i & 127;
            um[(i - j) + (j & 1) * 64 + (j >> 1)] = (uint8_t)(int)(c + zp + 128.0f);
        }
        scale_out[m] = scale;
        zp128_out[m] = zp + 128.0f;
    }
    return 0;
}

/* The same quantization for a GEMM: q - zp (integers in [-255, 255], exact in bfloat16) in column order, bf16
 * bits, and the per-row scale. Returns 1 (nothing trusted) when a row holds a NaN or an infinity. */
int q8_quantize_rows_bf16(const float *x, int64_t rows, int64_t k, uint16_t *centered, float *scale_out,
                          int threads) {
    int bad = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : bad)
    for (int64_t m = 0; m < rows; m++) {
        const float *xm = x + m * k;
        float mn, mx, scale, inv, zp;
        if (row_min_max(xm, k, &mn, &mx)) {
            bad = 1;
            continue;
        }
        token_qparams(mn, mx, &scale, &inv, &zp);
        const float lo = -128.0f - zp, hi = 127.0f - zp;
        uint16_t *cm = centered + m * k;
        for (int64_t i = 0; i < k; i++) {
            float c = rintf(xm[i] * inv);
            cm[i] = f32_to_bf16(c < lo ? lo : (c > hi ? hi : c));
        }
        scale_out[m] = scale;
    }
    return bad;
}

#if defined(Q4_AVX512) && defined(__AVX512VNNI__)
int q8_has_vnni(void) { return 1; }

static inline __m512 quarter_scales(const uint16_t *s, chunk_scales *cs) {
    const int64_t i0 = chunk_scales_next(cs), i1 = chunk_scales_next(cs), i2 = chunk_scales_next(cs);
    const int64_t i3 = chunk_scales_next(cs);
    const __m128i four = _mm_set_epi32(s[i3], s[i2], s[i1], s[i0]);
    const __m512 v = _mm512_castps128_ps512(_mm_castsi128_ps(_mm_slli_epi32(four, 16)));
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), v);
}

/* y[m * ldy] = scale[m] * sum_k (u - zp128)[m, k] * (nibble - 8)[k] * s[k / group], with exact int32 sums per
 * 4 columns (vpdpbusd), scaled per group of 32 in float32. */
static void gemv_row_vnni(const uint8_t *xu, int64_t rows, const float *tok_scale, const float *zp128,
                          const uint8_t *w, const uint16_t *s, int64_t k, int64_t group, float *y, int64_t ldy) {
    const __m512i mask = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8), ones = _mm512_set1_epi8(1);
    for (int64_t m0 = 0; m0 < rows; m0 += Q4_MAX_ROWS) {
        const int64_t mr = rows - m0 < Q4_MAX_ROWS ? rows - m0 : Q4_MAX_ROWS;
        __m512 acc[Q4_MAX_ROWS], zp[Q4_MAX_ROWS];
        for (int64_t m = 0; m < mr; m++) {
            acc[m] = _mm512_setzero_ps();
            zp[m] = _mm512_set1_ps(zp128[m0 + m]);
        }
        chunk_scales cs = chunk_scales_start(group);
        for (int64_t k0 = 0; k0 < k; k0 += 128) {
            const __m512i b = _mm512_loadu_si512((const void *)(w + k0 / 2));
            const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(b, mask), eight);
            const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(b, 4), mask), eight);
            const __m512 wsum = _mm512_cvtepi32_ps(
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_add_epi8(lo, hi)));
            const __m512 sv = quarter_scales(s, &cs);
            for (int64_t m = 0; m < mr; m++) {
                const uint8_t *xm = xu + (m0 + m) * k + k0;
                __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512((const void *)xm), lo);
                dot = _mm512_dpbusd_epi32(dot, _mm512_loadu_si512((const void *)(xm + 64)), hi);
                const __m512 f = _mm512_fnmadd_ps(wsum, zp[m], _mm512_cvtepi32_ps(dot));
                acc[m] = _mm512_fmadd_ps(f, sv, acc[m]);
            }
        }
        for (int64_t m = 0; m < mr; m++) y[(m0 + m) * ldy] = _mm512_reduce_add_ps(acc[m]) * tok_scale[m0 + m];
    }
}

/* One token (decode), four weight rows at a time, groups of 32: the activation loads are shared by the four
 * rows and their four dependency chains overlap; the 4 scales of a 128-column block are one 8-byte load. */
static void gemv4_vnni_g32(const uint8_t *xu, float tok_scale, float zp128, const uint8_t *w, const uint16_t *s,
                           int64_t k, float *y) {
    const __m512i mask = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8), ones = _mm512_set1_epi8(1);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512 zp = _mm512_set1_ps(zp128);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k0 = 0; k0 < k; k0 += 128) {
        const __m512i xl = _mm512_loadu_si512((const void *)(xu + k0));
        const __m512i xh = _mm512_loadu_si512((const void *)(xu + k0 + 64));
        for (int j = 0; j < 4; j++) {
            const __m512i b = _mm512_loadu_si512((const void *)(w + j * (k / 2) + k0 / 2));
            const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(b, mask), eight);
            const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(b, 4), mask), eight);
            const __m512 wsum = _mm512_cvtepi32_ps(
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_add_epi8(lo, hi)));
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), xl, lo);
            dot = _mm512_dpbusd_epi32(dot, xh, hi);
            const __m128i s4 = _mm_slli_epi32(
                _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(s + j * (k / 32) + k0 / 32))), 16);
            const __m512 sv = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_castsi128_ps(s4)));
            acc[j] = _mm512_fmadd_ps(_mm512_fnmadd_ps(wsum, zp, _mm512_cvtepi32_ps(dot)), sv, acc[j]);
        }
    }
    for (int j = 0; j < 4; j++) y[j] = _mm512_reduce_add_ps(acc[j]) * tok_scale;
}

/* The 8da4w matrix-vector product from q8_quantize_rows' output; k % 128 == 0 and group % 32 == 0. */
void q8q4_gemv(const uint8_t *xu, int64_t rows, const float *tok_scale, const float *zp128, const uint8_t *w,
               const uint16_t *s, int64_t n, int64_t k, int64_t group, float *y, int threads) {
    if (rows == 1 && group == 32) {
        const int64_t quads = n / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t q = 0; q < quads; q++)
            gemv4_vnni_g32(xu, tok_scale[0], zp128[0], w + 4 * q * (k / 2), s + 4 * q * (k / 32), k, y + 4 * q);
        for (int64_t r = 4 * quads; r < n; r++)
            gemv_row_vnni(xu, 1, tok_scale, zp128, w + r * (k / 2), s + r * (k / group), k, group, y + r, n);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < n; r++)
        gemv_row_vnni(xu, rows, tok_scale, zp128, w + r * (k / 2), s + r * (k / group), k, group, y + r, n);
}
/* q8_quantize_rows then q8q4_gemv in one call (one crossing from Python per linear); 1 when a row holds a NaN
 * or an infinity (nothing written), 2 when the scratch cannot be allocated. */
int q8q4_linear(const float *x, int64_t rows, int64_t k, const uint8_t *w, const uint16_t *s, int64_t n,
                int64_t group, float *y, int threads) {
    uint8_t *xu = (uint8_t *)malloc((size_t)(rows * k) + 2 * sizeof(float) * (size_t)rows + 64);
    if (!xu) return 2;
    float *tok_scale = (float *)(((uintptr_t)(xu + rows * k) + 63) & ~(uintptr_t)63);
    float *zp128 = tok_scale + rows;
    int bad = q8_quantize_rows(x, rows, k, xu, tok_scale, zp128);
    if (!bad) q8q4_gemv(xu, rows, tok_scale, zp128, w, s, n, k, group, y, threads);
    free(xu);
    return bad;
}
#else
int q8_has_vnni(void) { return 0; }

int q8q4_linear(const float *x, int64_t rows, int64_t k, const uint8_t *w, const uint16_t *s, int64_t n,
                int64_t group, float *y, int threads) {
    (void)x; (void)rows; (void)k; (void)w; (void)s; (void)n; (void)group; (void)y; (void)threads;
    return 3;
}

void q8q4_gemv(const uint8_t *xu, int64_t rows, const float *tok_scale, const float *zp128, const uint8_t *w,
               const uint16_t *s, int64_t n, int64_t k, int64_t group, float *y, int threads) {
    (void)xu; (void)rows; (void)tok_scale; (void)zp128; (void)w; (void)s; (void)n; (void)k; (void)group; (void)y;
    (void)threads;
}
#endif
