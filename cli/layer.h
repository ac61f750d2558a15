/*
 * layer.h - one GDN forward problem as the CLI handles it: the shape, the
 * tensors (in host or device memory), the random inputs of docs/benchmarks.md,
 * the prefix used for the reference check, and the comparison of two
 * forward results.
 */
#ifndef FQLA_CLI_LAYER_H
#define FQLA_CLI_LAYER_H

#include "cli.h"

typedef struct cli_shape {
    int64_t B, T, H, HV, K, V;
    int64_t N;              /* sequences: B, or the number of varlen lengths */
    int64_t *cu;            /* [N + 1] offsets when varlen (owned), else NULL */
} cli_shape;

/* The forward's tensors. q, k, v, o have dtype io; g and beta are fp32;
 * h0 and ht (initial and final state) are fp32 [N, HV, K, V]; cu is the
 * int64 cu_seqlens (NULL without varlen). */
typedef struct cli_layer {
    cli_shape s;
    fqla_dtype io;
    int on_device;
    void *q, *k, *v, *g, *beta, *h0, *cu, *o, *ht;
} cli_layer;

/* Sequence n covers tokens [start, start + len) of batch row *batch. */
void cli_shape_seq(const cli_shape *s, int64_t n, int64_t *batch, int64_t *start, int64_t *len);
int64_t cli_shape_tokens(const cli_shape *s); /* tokens inside sequences */
int cli_shape_copy(cli_shape *dst, const cli_shape *src);
void cli_shape_free(cli_shape *s);

/* 1 when every tensor's byte count (at 8 bytes an element, the fp64 prefix
 * of the check included) and the token count fit in int64; the options
 * bound each size, not their products. */
int cli_shape_fits(const cli_shape *s);
/* Element counts of each tensor. */
size_t cli_numel_qk(const cli_shape *s);
size_t cli_numel_vo(const cli_shape *s);
size_t cli_numel_gate(const cli_shape *s);
size_t cli_numel_state(const cli_shape *s);
/* Bytes of all tensors of a layer with q/k/v/o in dtype io. */
double cli_layer_bytes(const cli_shape *s, fqla_dtype io);

/* Host buffers (the shape is copied). Returns 0, or -1 when out of memory. */
int cli_layer_alloc_host(cli_layer *L, const cli_shape *s, fqla_dtype io);
/* Device copies of every tensor of src, outputs included (so the NaN poison
 * of cli_layer_fill travels too). */
int cli_layer_to_device(cli_layer *dst, const cli_layer *src, int device, char *err, size_t n);
/* Copies o and ht of a device layer into the host layer. */
int cli_layer_outputs_to_host(cli_layer *host, const cli_layer *dev, char *err, size_t n);
void cli_layer_free(cli_layer *L);

/* docs/benchmarks.md inputs (cli/inputs.c): q, k l2-normalised randn; v randn;
 * g = logsigmoid(randn) / 16 with g = 0 on a random quarter of the value
 * heads; beta = sigmoid(randn); h0 randn. Outputs are filled with NaN so a
 * region the call forgets to write shows. Runs on `threads` threads (0 = all
 * cores); the values depend on the seed only, not on the thread count.
 * Returns -1 when out of memory. */
int cli_layer_fill(cli_layer *L, uint64_t seed, int threads);

/* dst <- the first `tokens` tokens of every sequence of src (host layers),
 * with q/k/v converted to io. Returns -1 when out of memory. */
int cli_layer_prefix(cli_layer *dst, const cli_layer *src, int64_t tokens, fqla_dtype io);

/* Forward arguments over the layer's buffers (output_final_state on). */
void cli_layer_args(const cli_layer *L, fqla_fwd_args *a);

/* 1 when every valid element of o and ht is finite (host layer). */
int cli_layer_outputs_finite(const cli_layer *L);

/* rel = ||x - ref|| / ||ref|| over o (valid rows) and ht, with the worst
 * (sequence, head); +inf when x has NaN / Inf where ref is finite. */
typedef struct cli_rel {
    double rel;
    double worst;
    int64_t worst_seq, worst_head;
} cli_rel;
void cli_compare(const cli_layer *x, const cli_layer *ref, cli_rel *o, cli_rel *state);

#endif /* FQLA_CLI_LAYER_H */
