/* A step's decode rows attend on a CPU: each row's query heads over its own slot's keys and values, in one call for
 * every decode row of a layer (debate/engine/cpu_kernel.py builds this file and calls it; issue 59).
 *
 * Why not sdpa: a decode row's attention is memory-bound (one query row a head over thousands of columns), and
 * PyTorch's CPU flash kernel read them at 7.5-10.5 GB/s where one core streams 12-27 GB/s (docs/BENCHMARKS.md). This
 * loop reads each key once and each value once, in the cache's own layout, in two passes over a (row, key head):
 * the scores of the key head's query heads (kept, a few kilobytes), then their softmax-weighted sum of the values.
 * A row's result depends on its own columns alone, never on which rows share the call or on the thread count: the
 * same records at any batch size.
 *
 * Two versions from one text (a macro over the element type): float32, and bfloat16 (a bf16 run's queries, keys,
 * values and outputs, widened to float32 as they are read: float32's arithmetic over half the bytes).
 *
 * Plain C, no torch header: it builds in about a second with the system's C compiler, at this CPU's own vector
 * width (-march=native), and loads with ctypes. Strides are in elements. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef uint16_t bf16;

typedef float f32;

static inline float f32_load(const float *p) { return *p; }
static inline void f32_store(float *p, float x) { *p = x; }

/* bfloat16 is a float32's upper half: widening is a shift; narrowing rounds to nearest even, as torch does. */
static inline float bf16_load(const bf16 *p)
{
    const uint32_t bits = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &bits, sizeof f);  /* a union here kept the compiler from vectorizing the loops: 8 GB/s against 11 */
    return f;
}

static inline void bf16_store(bf16 *p, float x)
{
    union { uint32_t u; float f; } v = { .f = x };
    *p = (v.u & 0x7fffffffu) > 0x7f800000u ? (bf16)((v.u >> 16) | 0x40u)
                                           : (bf16)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline int thread_index(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* NAME_head: one (row, key head). `groups` query heads from `q` (a head every `q_head`), keys and values from column
 * `low` to `high` (exclusive), a column every `k_col` / `v_col`, `dim` wide; the output's heads a head every
 * `o_head`. `scores` holds groups x (high - low) floats.
 *
 * NAME: every decode row of a layer. `rows` is (n, 4): a row's slot, its token's place in the step's sequence, and
 * the columns it reads, low to high (exclusive). `scratch` holds `threads` x heads / kv_heads x `widest` floats.
 * Returns 0, or 1 (nothing written) when a row's columns are empty or wider than `widest`. */
#define KERNEL(T, NAME)                                                                                              \
static inline __attribute__((always_inline))                                                                         \
void NAME##_head(const T *q, int64_t q_head, const T *k, int64_t k_col, const T *v, int64_t v_col,                   \
                 T *o, int64_t o_head, int64_t low, int64_t high, int64_t groups, int64_t dim, float scale,          \
                 float *scores)                                                                                      \
{                                                                                                                    \
    const int64_t count = high - low;                                                                                \
    float query[groups * dim], acc[groups * dim], top[groups], total[groups];                                       \
    for (int64_t g = 0; g < groups; g++) {                                                                           \
        for (int64_t d = 0; d < dim; d++)                                                                            \
            query[g * dim + d] = T##_load(q + g * q_head + d) * scale;                                               \
        top[g] = -INFINITY;                                                                                          \
    }                                                                                                                \
    for (int64_t t = 0; t < count; t++) {                                                                            \
        const T *key = k + (low + t) * k_col;                                                                        \
        for (int64_t g = 0; g < groups; g++) {                                                                       \
            float dot = 0.0f;                                                                                        \
            for (int64_t d = 0; d < dim; d++)                                                                        \
                dot += query[g * dim + d] * T##_load(key + d);                                                       \
            scores[g * count + t] = dot;                                                                             \
            top[g] = dot > top[g] ? dot : top[g];                                                                    \
        }                                                                                                            \
    }                                                                                                                \
    for (int64_t g = 0; g < groups; g++) {                                                                           \
        float *row = scores + g * count, sum = 0.0f;                                                                 \
        const float peak = top[g];                                                                                   \
        for (int64_t t = 0; t < count; t++) {                                                                        \
            row[t] = expf(row[t] - peak);                                                                            \
            sum += row[t];                                                                                           \
        }                                                                                                            \
        total[g] = sum;                                                                                              \
    }                                                                                                                \
    for (int64_t i = 0; i < groups * dim; i++)                                                                       \
        acc[i] = 0.0f;                                                                                               \
    for (int64_t t = 0; t < count; t++) {                                                                            \
        const T *value = v + (low + t) * v_col;                                                                      \
        for (int64_t g = 0; g < groups; g++) {                                                                       \
            const float weight = scores[g * count + t];                                                              \
            for (int64_t d = 0; d < dim; d++)                                                                        \
                acc[g * dim + d] += weight * T##_load(value + d);                                                    \
        }                                                                                                            \
    }                                                                                                                \
    for (int64_t g = 0; g < groups; g++)                                                                             \
        for (int64_t d = 0; d < dim; d++)                                                                            \
            T##_store(o + g * o_head + d, acc[g * dim + d] / total[g]);                                              \
}                                                                                                                    \
                                                                                                                     \
int NAME(const T *query, int64_t q_token, int64_t q_head,                                                            \
         const T *keys, int64_t k_slot, int64_t k_head, int64_t k_col,                                               \
         const T *values, int64_t v_slot, int64_t v_head, int64_t v_col,                                             \
         T *out, int64_t o_token, int64_t o_head,                                                                    \
         const int64_t *rows, int64_t n, int64_t heads, int64_t kv_heads, int64_t dim, float scale,                  \
         float *scratch, int64_t widest, int threads)                                                                \
{                                                                                                                    \
    const int64_t groups = heads / kv_heads;                                                                         \
    for (int64_t r = 0; r < n; r++)                                                                                  \
        if (rows[4 * r + 3] <= rows[4 * r + 2] || rows[4 * r + 3] - rows[4 * r + 2] > widest)                        \
            return 1;                                                                                                \
    _Pragma("omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1)")                              \
    for (int64_t task = 0; task < n * kv_heads; task++) {                                                            \
        const int64_t *row = rows + 4 * (task / kv_heads);                                                           \
        const int64_t head = task % kv_heads, slot = row[0], place = row[1];                                         \
        const T *q = query + place * q_token + head * groups * q_head;                                               \
        const T *k = keys + slot * k_slot + head * k_head, *v = values + slot * v_slot + head * v_head;              \
        T *o = out + place * o_token + head * groups * o_head;                                                       \
        float *scores = scratch + (int64_t)thread_index() * groups * widest;                                         \
        /* Llama's widths as constants, the compiler unrolls their loops (1.1x a call on the tiny Llama's; 256, \
         * Gemma's, was no faster so) */                                                                            \
        switch (dim) {                                                                                               \
        case 32: NAME##_head(q, q_head, k, k_col, v, v_col, o, o_head, row[2], row[3], groups, 32, scale, scores);   \
            break;                                                                                                   \
        case 64: NAME##_head(q, q_head, k, k_col, v, v_col, o, o_head, row[2], row[3], groups, 64, scale, scores);   \
            break;                                                                                                   \
        case 128: NAME##_head(q, q_head, k, k_col, v, v_col, o, o_head, row[2], row[3], groups, 128, scale, scores); \
            break;                                                                                                   \
        default: NAME##_head(q, q_head, k, k_col, v, v_col, o, o_head, row[2], row[3], groups, dim, scale, scores);  \
        }                                                                                                            \
    }                                                                                                                \
    return 0;                                                                                                        \
}

KERNEL(f32, decode_rows_f32)
KERNEL(bf16, decode_rows_bf16)
