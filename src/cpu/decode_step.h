/*
 * decode_step.h - one token of the GDN recurrence (docs/design.md §1) on a
 * tile of an fp32 state, for the decode / verify path (cpu_decode.c).
 *
 * With a = exp(g), the token's update and output split by value column j:
 *     w_j = sum_i k_i S_ij      r_j = sum_i q_i S_ij      (one read of S)
 *     u_j = beta (v_j - a w_j)
 *     S_ij <- a S_ij + k_i u_j                             (one write of S)
 *     o_j = scale sum_i q_i S'_ij = scale (a r_j + (q.k) u_j)
 * so a tile of value columns (a strip of a [K, V] state, a few rows of a
 * [V, K] one) is a whole problem on its own: it is read, updated and
 * written while it sits in L1, and the state crosses the memory hierarchy
 * once per token block instead of twice per token.
 *
 * The bodies: portable C (any size), AVX2 + FMA and AVX-512F (x86 with GCC
 * or clang; target attributes, so one build runs anywhere), NEON (aarch64,
 * where it is baseline), chosen per call from fqla_cpu_isa(). The SIMD
 * bodies need the tile's vector length to be a multiple of their width
 * (NEON: 16-column [K, V] tiles, [V, K] rows of K % 4 == 0) and take the
 * portable body otherwise.
 */
#ifndef FQLA_CPU_DECODE_STEP_H
#define FQLA_CPU_DECODE_STEP_H

#include <stdint.h>

/* One token: q, k [K], v the tile's own value entries, the gate a = exp(g),
 * beta, and the output factors ca = scale a, cu = scale (q.k). */
typedef struct fqla_decode_token {
    const float *q, *k, *v;
    float a, beta, ca, cu;
} fqla_decode_token;

/* The value-column tile of a [K, V] state copied into a local buffer (32
 * floats: K x 32 stays in L1); a [V, K] tile is any number of rows. In
 * place, a [K, V] tile may be whole rows (FQLA_DECODE_KV_WIDE columns, the
 * state then in L2 between the two passes, read in memory order). */
#define FQLA_DECODE_KV_TILE 32
#define FQLA_DECODE_KV_WIDE 128

/* A [K, V] state: columns [0, w) of K rows of ld floats (w <= FQLA_DECODE_KV_WIDE), S
 * updated in place; o[0..w) receives the outputs. */
void fqla_decode_step_kv(int64_t K, int64_t w, float *S, int64_t ld, const fqla_decode_token *t,
                         float *o);

/* A [V, K] state: rows [0, n) of K floats each, ld floats apart, S updated
 * in place; o[0..n) receives the outputs (row j is value column j). */
void fqla_decode_step_vk(int64_t K, int64_t n, float *S, int64_t ld, const fqla_decode_token *t,
                         float *o);

/* Out of place: the token read from S and the new state written to D
 * (verify writes each step's state straight into step_states, the next
 * token reading it back from cache). Only where fqla_decode_step_to_ok says
 * (AVX-512; [V, K] with K % 16 == 0, any w; [K, V] with V = w =
 * FQLA_DECODE_KV_WIDE). */
int fqla_decode_step_to_ok(int64_t K, int64_t V, int v_first);
void fqla_decode_step_to(int v_first, int64_t K, int64_t w, const float *S, int64_t ld, float *D, int64_t ldd,
                         const fqla_decode_token *t, float *o);

/* dst[r][0..w) = src[r][0..w) for r < rows (fp32 tile in / out of an F32
 * tensor). Plain stores, not streaming ones: step states are read again
 * soon (the accepted one), and a few MB of them stay in L3, where storing
 * 8 MB took 83 us against 294 us streamed to memory on the CI guest. */
void fqla_decode_copy_rows(int64_t rows, int64_t w, const float *src, int64_t lds, float *dst, int64_t ldd);

#endif
