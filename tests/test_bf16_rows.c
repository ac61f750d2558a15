/*
 * test_bf16_rows.c - the row conversions between bf16 and fp32 that the CPU
 * backends run on every q, k, v and o element (src/tensor.c): they must give
 * the same bits as the element functions fqla_bf16_to_f32 / fqla_f32_to_bf16
 * (round to nearest even, NaN kept a quiet NaN), whatever the row length and
 * alignment, on every bf16 value and on a sweep of fp32 bit patterns that
 * includes the rounding ties, denormals, infinities and NaNs.
 */
#include "common/check.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Every bf16 value, in rows of every length 0..19 and every start offset. */
static void widen_every_value(void)
{
    enum { N = 65536 + 32 };
    uint16_t *src = malloc(N * sizeof *src);
    float *got = malloc(N * sizeof *got);
    for (int i = 0; i < N; i++) src[i] = (uint16_t)i;
    fqla_bf16_row_to_f32(src, 65536, got);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        float want = fqla_bf16_to_f32(src[i]);
        if (memcmp(&got[i], &want, sizeof want)) bad++;
    }
    CHECK(bad == 0, "%d of 65536 bf16 values widened differently", bad);
    for (int off = 0; off < 4; off++)
        for (int n = 0; n < 20; n++) {
            float row[24];
            for (int i = 0; i < 24; i++) row[i] = -7.0f; /* past n must stay */
            fqla_bf16_row_to_f32(src + 0x3f00 + off, n, row);
            for (int i = 0; i < 24; i++) {
                float want = i < n ? fqla_bf16_to_f32(src[0x3f00 + off + i]) : -7.0f;
                CHECK(memcmp(&row[i], &want, sizeof want) == 0, "length %d offset %d: element %d", n, off, i);
            }
        }
    free(src);
    free(got);
}

/* fp32 bit patterns: a stride through all 2^32 plus the neighbourhood of
 * every bf16 rounding boundary of a few exponents, the specials, and rows of
 * every length 0..19. */
static void narrow_sweep(void)
{
    enum { BLOCK = 4096 };
    float *src = malloc(BLOCK * sizeof *src);
    uint16_t *got = malloc(BLOCK * sizeof *got);
    long bad = 0, total = 0;
    for (uint64_t base = 0; base < (1ull << 32); base += 977ull * BLOCK) {
        for (int i = 0; i < BLOCK; i++) src[i] = from_bits((uint32_t)(base + 977ull * (uint64_t)i));
        fqla_f32_row_to_bf16(src, BLOCK, got);
        for (int i = 0; i < BLOCK; i++, total++) bad += got[i] != fqla_f32_to_bf16(src[i]);
    }
    const uint32_t exps[] = {0x00000000u, 0x00800000u, 0x3f800000u, 0x7f000000u, 0x80000000u, 0xbf800000u,
                             0x7f800000u, 0xff800000u};
    for (int e = 0; e < 8; e++)
        for (uint32_t lo = 0; lo < BLOCK; lo++) { /* ties 0x8000 and neighbours around several mantissas */
            uint32_t u = exps[e] + ((lo / 64) << 16) + 0x7fe0u + (lo % 64);
            float x = from_bits(u);
            uint16_t r;
            fqla_f32_row_to_bf16(&x, 1, &r); /* the scalar tail */
            src[lo] = x;
            bad += r != fqla_f32_to_bf16(x);
        }
    fqla_f32_row_to_bf16(src, BLOCK, got);
    for (int i = 0; i < BLOCK; i++, total++) bad += got[i] != fqla_f32_to_bf16(src[i]);
    CHECK(bad == 0, "%ld of %ld fp32 values narrowed differently", bad, total);
    printf("  %ld fp32 values compared\n", total);
    for (int n = 0; n < 20; n++) {
        uint16_t row[24];
        for (int i = 0; i < 24; i++) row[i] = 0xabcd;
        fqla_f32_row_to_bf16(src + 1, n, row);
        for (int i = 0; i < 24; i++)
            CHECK(row[i] == (i < n ? fqla_f32_to_bf16(src[1 + i]) : 0xabcd), "length %d: element %d", n, i);
    }
    free(src);
    free(got);
}

int main(void)
{
    CHECK_RUN(widen_every_value);
    CHECK_RUN(narrow_sweep);
    return check_summary();
}
