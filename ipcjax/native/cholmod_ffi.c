/* The sparse Newton direction inside XLA: an FFI handler that assembles H's upper
 * triangle from the element blocks and solves H u = b by CHOLMOD's supernodal Cholesky,
 * keeping the assembly's scatter map and CHOLMOD's symbolic analysis per pattern.
 *
 * Plain C against XLA's FFI C API (xla/ffi/api/c_api.h, in jax.ffi.include_dir()), so
 * that gcc alone builds it. ipcjax/cholmod_ffi.py compiles it on first use, linked to the
 * CHOLMOD library inside the cvxopt wheel, and registers IpcjaxCholmodSolve as the XLA
 * custom call "ipcjax_cholmod_solve" (docs/design.md, "The sparse direction inside XLA")
 * and IpcjaxCholmodTry, the same without naming a failed factorization (point 2), as
 * "ipcjax_cholmod_try".
 * What it computes is ipcjax/ldl.py's host_solve(..., require_pd=True):
 *
 *   H = diag(d) + sum over groups g, elements e of P_e^T B_e P_e   (rows >= n: fixed DOFs)
 *
 * Arguments: d (n) f64, b (n) f64, then per group its rows (E, k) s32 and blocks
 * (E, k, k) f64. Results: u (n) f64, status () s32 (ipcjax.result.LinearStatus).
 *
 * 1. An element whose rows are all >= n (fixed DOFs; the assembly gives a contact row that
 *    adds nothing such rows) is left out unread, and so is an element whose block is all
 *    zeros; every entry of the other elements is kept, zero or not. The pattern is the list
 *    of the kept elements' rows; a pattern seen before reuses its CSC structure, its
 *    scatter map (each kept entry's place in its block and in the CSC values: one pass of
 *    += with no tests) and its CHOLMOD analysis. A new pattern is built from the particles
 *    where the rows come in particle triples, as the assembly's do (build_by_particles),
 *    else from the entries (build_by_entries); both give the same arrays
 *    (ipcjax_pattern_selfcheck, tests/test_sparse.py).
 * 2. CHOLMOD factorizes P H P^T = L L^T (supernodal). Where it finds a pivot <= 0, this
 *    file's own LDL^T without pivoting (CHOLMOD's ordering P) names the failure as QDLDL
 *    does in ldl.py: a zero or non-finite pivot is SINGULAR, a negative one
 *    NOT_POSITIVE_DEFINITE; should every pivot be positive there after all (a matrix at
 *    the edge of definiteness), its solution is the answer. IpcjaxCholmodTry skips that
 *    LDL^T: any pivot <= 0 is NOT_POSITIVE_DEFINITE (for a caller that only needs to
 *    know whether H is positive definite: the exact tangent tried first, ipcjax/newton.py).
 *    CHOLMOD prints nothing: every failure reaches the caller as a status or an error.
 * 3. A NaN or an infinity in d, b or a block that is read (point 1) is NON_FINITE_INPUT, a
 *    non-finite solution SINGULAR. A failure writes NaN into u and its status. Arguments
 *    of the wrong type or shape, and a CHOLMOD error (out of memory), are FFI errors,
 *    which JAX raises.
 *
 * CHOLMOD's header is not part of the wheel, so the few structures used are declared
 * here by hand for CHOLMOD 3 (SuiteSparse 5); ipcjax_cholmod_check() verifies the version
 * and the defaults cholmod_start writes at the offsets used, and the Python side refuses
 * the library unless it returns "".
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xla/ffi/api/c_api.h"

int cholmod_start(void *common);
int cholmod_version(int *version);
void *cholmod_analyze(void *A, void *common);
int cholmod_factorize(void *A, void *L, void *common);
void *cholmod_solve(int sys, void *L, void *B, void *common);
int cholmod_free_factor(void **L, void *common);
int cholmod_free_dense(void **X, void *common);

/* CHOLMOD 3's cholmod_sparse, cholmod_dense and the head of cholmod_factor. */
typedef struct {
  size_t nrow, ncol, nzmax;
  void *p, *i, *nz, *x, *z;
  int stype, itype, xtype, dtype, sorted, packed;
} CholmodSparse;
typedef struct {
  size_t nrow, ncol, nzmax, d;
  void *x, *z;
  int xtype, dtype;
} CholmodDense;
typedef struct {
  size_t n, minor;
  void *Perm;
} CholmodFactorHead;

enum { kInt = 0, kReal = 1, kDouble = 0, kUpper = 1, kSolveA = 0, kSupernodal = 2 };
/* Offsets into cholmod_common (CHOLMOD 3) of the fields set or checked. */
enum { kOffSupernodal = 48, kOffPrint = 144 };
/* ipcjax.result.LinearStatus */
enum { kSuccessful = 0, kNonFiniteInput = 1, kNotPositiveDefinite = 2, kSingular = 3 };

static _Alignas(64) unsigned char common[1 << 16]; /* cholmod_common: about 2.3 kB in CHOLMOD 3 */
static char why[256];                               /* empty when the library is the expected one */
static pthread_once_t started = PTHREAD_ONCE_INIT;
static pthread_mutex_t cache_mutex = PTHREAD_MUTEX_INITIALIZER;

static double field_f64(size_t off) { double v; memcpy(&v, common + off, sizeof v); return v; }
static size_t field_size(size_t off) { size_t v; memcpy(&v, common + off, sizeof v); return v; }
static int field_int(size_t off) { int v; memcpy(&v, common + off, sizeof v); return v; }

static void start(void) {
  int v[3] = {0, 0, 0};
  cholmod_version(v);
  if (v[0] != 3) {
    snprintf(why, sizeof why, "CHOLMOD %d.%d.%d is not the CHOLMOD 3 this module's declarations are written for",
             v[0], v[1], v[2]);
    return;
  }
  cholmod_start(common);
  /* the defaults cholmod_start writes, at the offsets this file assumes */
  int ok = field_f64(0) == 0.0 && field_f64(8) == 1.2 && field_f64(16) == 1.2 && field_size(24) == 5 &&
           field_size(32) == 8 && field_f64(40) == 40.0 && field_int(kOffSupernodal) == 1 && field_f64(80) == 0.8 &&
           field_size(104) == 4 && field_int(kOffPrint) == 3;
  if (!ok) {
    snprintf(why, sizeof why, "cholmod_common's layout is not the one this module's declarations assume");
    return;
  }
  int supernodal = kSupernodal, print = 0; /* supernodal LL^T; failures are returned, not printed */
  memcpy(common + kOffSupernodal, &supernodal, sizeof supernodal);
  memcpy(common + kOffPrint, &print, sizeof print);
}

const char *ipcjax_cholmod_check(void) {
  pthread_once(&started, start);
  return why;
}

typedef struct {
  const int32_t *rows;  /* (E, k) */
  const double *blocks; /* (E, k, k) */
  int64_t E, k;
  uint8_t *used; /* (E) the element's block is not all zeros (mark_used) */
} Group;

/* One assembly pattern: which elements were kept, where each of their entries goes. */
typedef struct {
  int32_t *signature; /* n, then per group k, the kept count and the kept rows */
  size_t signature_len;
  int32_t *colptr, *rowidx, *diag_at, *scatter; /* scatter: each kept entry's position, in visiting order */
  uint16_t *offset; /* each kept entry's place in its element's block (a k + b), in visiting order */
  int32_t *kept;    /* per used element, in visiting order: its kept entries */
  int64_t nnz;
  void *L; /* CHOLMOD's factor: analysis kept, numbers overwritten */
} Pattern;

enum { kPatternsKept = 4 };
static Pattern *patterns[kPatternsKept]; /* oldest first */
static int n_patterns;

static void free_pattern(Pattern *p) {
  if (p->L) cholmod_free_factor(&p->L, common);
  free(p->signature), free(p->colptr), free(p->rowidx), free(p->diag_at), free(p->scatter), free(p->offset);
  free(p->kept), free(p);
}

/* One pass over the elements: which are used, and whether every entry read is finite (the
 * return value). An element whose rows are all >= n (fixed DOFs, or a contact row the
 * assembly marks as adding nothing: ipcjax.potential.Elements) adds no entry, so its block
 * is not read; any other element is used when its block is not all zeros. The entries are
 * tested as bit patterns (a nonzero one has a bit set below the sign, a non-finite one has
 * every exponent bit set), which the compiler vectorizes. */
__attribute__((optimize("O3"))) static int mark_used(Group *groups, int n_groups, int32_t n) {
  const uint64_t exponent = 0x7ff0000000000000ULL;
  uint64_t bad = 0;
  for (int gi = 0; gi < n_groups; ++gi) {
    Group *g = &groups[gi];
    const int64_t k = g->k, kk = k * k;
    for (int64_t e = 0; e < g->E; ++e) {
      const int32_t *r = g->rows + e * k;
      int inside = 0;
      for (int64_t a = 0; a < k; ++a) inside |= r[a] < n;
      if (!inside) {
        g->used[e] = 0;
        continue;
      }
      const double *B = g->blocks + e * kk;
      uint64_t any = 0;
      for (int64_t t = 0; t < kk; ++t) {
        uint64_t v;
        memcpy(&v, B + t, sizeof v);
        any |= v << 1;
        bad |= (uint64_t)((v & exponent) == exponent);
      }
      g->used[e] = any != 0;
    }
  }
  return bad == 0;
}

/* The kept upper-triangle entries in the one visiting order (groups, kept elements, a, b),
 * each as entry_row <= entry_col < n, entry_value, its place in its element's block
 * (entry_offset = a k + b) and its element's ordinal among the used ones (entry_element). */
#define FOR_EACH_ENTRY(groups, n_groups, n, BODY)                          \
  {                                                                        \
    int64_t used_ = -1;                                                    \
    for (int gi = 0; gi < (n_groups); ++gi) {                              \
      const Group *g_ = &(groups)[gi];                                     \
      const int64_t k_ = g_->k, kk_ = k_ * k_;                             \
      for (int64_t e_ = 0; e_ < g_->E; ++e_) {                             \
        const double *B_ = g_->blocks + e_ * kk_;                          \
        if (!g_->used[e_]) continue;                                       \
        ++used_;                                                           \
        const int32_t *r_ = g_->rows + e_ * k_;                            \
        for (int64_t a_ = 0; a_ < k_; ++a_)                                \
          for (int64_t b_ = 0; b_ < k_; ++b_)                              \
            if (r_[a_] <= r_[b_] && r_[b_] < (n)) {                        \
              const int32_t entry_row = r_[a_], entry_col = r_[b_];        \
              const double entry_value = B_[a_ * k_ + b_];                 \
              const int64_t entry_offset = a_ * k_ + b_, entry_element = used_; \
              (void)entry_row, (void)entry_col, (void)entry_value, (void)entry_offset, (void)entry_element; \
              BODY;                                                        \
            }                                                              \
      }                                                                    \
    }                                                                      \
  }

static int32_t *signature(const Group *groups, int n_groups, int32_t n, size_t *len) {
  size_t cap = 1;
  for (int gi = 0; gi < n_groups; ++gi) cap += 2 + (size_t)(groups[gi].E * groups[gi].k);
  int32_t *sig = malloc(cap * sizeof *sig);
  if (!sig) return NULL;
  size_t m = 0;
  sig[m++] = n;
  for (int gi = 0; gi < n_groups; ++gi) {
    const Group *g = &groups[gi];
    sig[m++] = (int32_t)g->k;
    const size_t count_at = m++;
    sig[count_at] = 0;
    for (int64_t e = 0; e < g->E; ++e) {
      if (!g->used[e]) continue;
      memcpy(sig + m, g->rows + e * g->k, g->k * sizeof *sig);
      m += g->k;
      ++sig[count_at];
    }
  }
  *len = m;
  return sig;
}

static int compare_int32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* The CSC pattern of the kept entries and the diagonal, with each entry's position: by
 * entries, for rows of any layout (build_pattern takes build_by_particles where it can). */
static Pattern *build_by_entries(const Group *groups, int n_groups, int32_t n, int32_t *sig, size_t sig_len) {
  int64_t m = n;
  FOR_EACH_ENTRY(groups, n_groups, n, ++m);
  Pattern *pat = calloc(1, sizeof *pat);
  int32_t *row = malloc(m * sizeof *row), *col = malloc(m * sizeof *col), *start = calloc(n + 1, sizeof *start);
  int32_t *by_row = malloc(m * sizeof *by_row), *by_id = malloc(m * sizeof *by_id), *fill = malloc(n * sizeof *fill);
  int32_t *seen = malloc(n * sizeof *seen), *slot = malloc(n * sizeof *slot), *at = malloc(m * sizeof *at);
  int32_t *distinct = malloc(n * sizeof *distinct);
  if (pat) pat->colptr = calloc(n + 1, sizeof(int32_t)), pat->rowidx = malloc(m * sizeof(int32_t));
  if (!pat || !row || !col || !start || !by_row || !by_id || !fill || !seen || !slot || !at || !distinct ||
      !pat->colptr || !pat->rowidx) {
    free(row), free(col), free(start), free(by_row), free(by_id), free(fill), free(seen), free(slot), free(at);
    free(distinct);
    if (pat) free(pat->colptr), free(pat->rowidx), free(pat);
    return NULL;
  }
  int64_t t = 0;
  for (int32_t j = 0; j < n; ++j) row[t] = j, col[t] = j, ++t;
  FOR_EACH_ENTRY(groups, n_groups, n, (row[t] = entry_row, col[t] = entry_col, ++t));
  /* bucket the entries by column, one CSC slot per distinct row, rows sorted */
  for (t = 0; t < m; ++t) ++start[col[t] + 1];
  for (int32_t j = 0; j < n; ++j) start[j + 1] += start[j], fill[j] = start[j], seen[j] = -1;
  for (t = 0; t < m; ++t) {
    const int32_t q = fill[col[t]]++;
    by_row[q] = row[t], by_id[q] = (int32_t)t;
  }
  int64_t nnz = 0;
  for (int32_t j = 0; j < n; ++j) {
    int32_t count = 0;
    for (int32_t q = start[j]; q < start[j + 1]; ++q)
      if (seen[by_row[q]] != j) seen[by_row[q]] = j, distinct[count++] = by_row[q];
    qsort(distinct, count, sizeof *distinct, compare_int32);
    for (int32_t c = 0; c < count; ++c) slot[distinct[c]] = (int32_t)(nnz + c), pat->rowidx[nnz + c] = distinct[c];
    for (int32_t q = start[j]; q < start[j + 1]; ++q) at[by_id[q]] = slot[by_row[q]];
    nnz += count;
    pat->colptr[j + 1] = (int32_t)nnz;
  }
  pat->nnz = nnz;
  pat->signature = sig, pat->signature_len = sig_len;
  pat->diag_at = malloc(n * sizeof(int32_t));
  pat->scatter = malloc((m - n + 1) * sizeof(int32_t));
  pat->offset = malloc((m - n + 1) * sizeof(uint16_t));
  int64_t n_used = 0;
  for (int gi = 0; gi < n_groups; ++gi)
    for (int64_t e = 0; e < groups[gi].E; ++e) n_used += groups[gi].used[e];
  pat->kept = calloc(n_used + 1, sizeof(int32_t));
  if (pat->diag_at && pat->scatter && pat->offset && pat->kept) {
    memcpy(pat->diag_at, at, n * sizeof(int32_t));
    memcpy(pat->scatter, at + n, (m - n) * sizeof(int32_t));
    int64_t q = 0;
    FOR_EACH_ENTRY(groups, n_groups, n, (pat->offset[q++] = (uint16_t)entry_offset, ++pat->kept[entry_element]));
  }
  free(row), free(col), free(start), free(by_row), free(by_id), free(fill), free(seen), free(slot), free(at);
  free(distinct);
  if (!pat->diag_at || !pat->scatter || !pat->offset || !pat->kept) {
    pat->signature = NULL;
    free_pattern(pat);
    return NULL;
  }
  return pat;
}

/* Whether every used element's rows come in particle triples: (3p, 3p + 1, 3p + 2) with
 * 3p + 2 < n, or all three >= n (a fixed particle). The assembly's rows always do
 * (ipcjax.potential: _dof_rows, and the fixed-particle rows of an element that adds nothing). */
static int rows_are_triples(const Group *groups, int n_groups, int32_t n) {
  if (n % 3) return 0;
  for (int gi = 0; gi < n_groups; ++gi) {
    const Group *g = &groups[gi];
    const int64_t k = g->k;
    for (int64_t e = 0; e < g->E; ++e) {
      if (!g->used[e]) continue;
      if (k % 3) return 0;
      const int32_t *r = g->rows + e * k;
      for (int64_t i = 0; i < k; i += 3) {
        if (r[i] >= n) {
          if (r[i + 1] < n || r[i + 2] < n) return 0;
        } else if (r[i] < 0 || r[i] % 3 || r[i + 1] != r[i] + 1 || r[i + 2] != r[i] + 2) {
          return 0;
        }
      }
    }
  }
  return 1;
}

/* build_by_entries' pattern, bit for bit, from the particles instead of the entries, for rows
 * in particle triples (rows_are_triples). Column 3q + b of H's upper triangle holds rows
 * 3p, 3p + 1, 3p + 2 for each particle p < q that shares a kept element with q, then rows
 * 3q ... 3q + b when q is in a kept element (else row 3q + b alone, the diagonal): so the
 * pattern follows from the sorted particle lists of the columns, and an entry's place from
 * its particles' rank in them, and the pass over the k x k entries of every element that
 * build_by_entries makes three times (counting, bucketing, recording) is made once. */
/* The particle pairs of each kept element, for rows in particle triples: slots i, j < s_ = k / 3
 * whose particles r_[3i] / 3 <= r_[3j] / 3 are both free, in one visiting order (groups, kept
 * elements, i, j). BODY sees pair_i, pair_j, r_ (the element's rows), s_ and k_; ELEMENT_END
 * runs after each kept element's pairs, with r_, s_ and k_. */
#define FOR_EACH_PAIR(groups, n_groups, n, BODY, ELEMENT_END)                 \
  for (int gi_ = 0; gi_ < (n_groups); ++gi_) {                               \
    const Group *g_ = &(groups)[gi_];                                        \
    const int64_t k_ = g_->k, s_ = k_ / 3;                                   \
    for (int64_t e_ = 0; e_ < g_->E; ++e_) {                                 \
      if (!g_->used[e_]) continue;                                           \
      const int32_t *r_ = g_->rows + e_ * k_;                                \
      for (int64_t pair_i = 0; pair_i < s_; ++pair_i)                        \
        for (int64_t pair_j = 0; pair_j < s_; ++pair_j)                      \
          if (r_[3 * pair_i] <= r_[3 * pair_j] && r_[3 * pair_j] < (n)) {    \
            BODY;                                                            \
          }                                                                  \
      ELEMENT_END;                                                           \
    }                                                                        \
  }

static Pattern *build_by_particles(const Group *groups, int n_groups, int32_t n, int32_t *sig, size_t sig_len) {
  const int32_t np = n / 3;
  int64_t n_pairs = 0, n_entries = 0, n_used = 0, max_s = 1;
  FOR_EACH_PAIR(groups, n_groups, n, (++n_pairs, n_entries += r_[3 * pair_i] < r_[3 * pair_j] ? 9 : 6),
                (++n_used, max_s = s_ > max_s ? s_ : max_s));
  Pattern *pat = calloc(1, sizeof *pat);
  int32_t *pair_p = malloc((n_pairs + 1) * sizeof *pair_p), *pair_q = malloc((n_pairs + 1) * sizeof *pair_q);
  int32_t *rank = malloc((n_pairs + 1) * sizeof *rank), *by_p = malloc((n_pairs + 1) * sizeof *by_p);
  int32_t *by_id = malloc((n_pairs + 1) * sizeof *by_id), *start = calloc(np + 1, sizeof *start);
  int32_t *fill = malloc((np + 1) * sizeof *fill), *seen = malloc((np + 1) * sizeof *seen);
  int32_t *slot = malloc((np + 1) * sizeof *slot), *distinct = malloc((np + 1) * sizeof *distinct);
  int32_t *lists = malloc((n_pairs + 1) * sizeof *lists), *list_at = calloc(np + 1, sizeof *list_at);
  int32_t *table = malloc(max_s * max_s * sizeof *table);
  if (pat) {
    pat->colptr = calloc(n + 1, sizeof(int32_t)), pat->diag_at = malloc((n + 1) * sizeof(int32_t));
    pat->scatter = malloc((n_entries + 1) * sizeof(int32_t)), pat->offset = malloc((n_entries + 1) * sizeof(uint16_t));
    pat->kept = calloc(n_used + 1, sizeof(int32_t));
  }
  int ok = pat && pair_p && pair_q && rank && by_p && by_id && start && fill && seen && slot && distinct && lists &&
           list_at && table && pat->colptr && pat->diag_at && pat->scatter && pat->offset && pat->kept;
  if (ok) {
    int64_t t = 0;
    FOR_EACH_PAIR(groups, n_groups, n, (pair_p[t] = r_[3 * pair_i] / 3, pair_q[t] = r_[3 * pair_j] / 3, ++t), (void)0);
    /* bucket the pairs by column particle q; each column's distinct p, sorted, and each pair's rank */
    for (t = 0; t < n_pairs; ++t) ++start[pair_q[t] + 1];
    for (int32_t q = 0; q < np; ++q) start[q + 1] += start[q], fill[q] = start[q], seen[q] = -1;
    for (t = 0; t < n_pairs; ++t) {
      const int32_t at = fill[pair_q[t]]++;
      by_p[at] = pair_p[t], by_id[at] = (int32_t)t;
    }
    int64_t nnz = 0, listed = 0;
    for (int32_t q = 0; q < np; ++q) {
      int32_t count = 0;
      for (int32_t a = start[q]; a < start[q + 1]; ++a)
        if (seen[by_p[a]] != q) seen[by_p[a]] = q, distinct[count++] = by_p[a];
      qsort(distinct, count, sizeof *distinct, compare_int32);
      for (int32_t c = 0; c < count; ++c) slot[distinct[c]] = c;
      for (int32_t a = start[q]; a < start[q + 1]; ++a) rank[by_id[a]] = slot[by_p[a]];
      const int own = count > 0 && distinct[count - 1] == q, others = count - own;
      for (int b = 0; b < 3; ++b) { /* column 3q + b: the other particles' rows, then q's own */
        const int32_t j = 3 * q + b;
        pat->colptr[j] = (int32_t)nnz;
        nnz += 3 * others + (own ? b + 1 : 1);
        pat->diag_at[j] = (int32_t)nnz - 1;
      }
      list_at[q] = (int32_t)listed;
      memcpy(lists + listed, distinct, others * sizeof *lists);
      listed += others;
    }
    pat->colptr[n] = (int32_t)nnz;
    pat->nnz = nnz;
    pat->rowidx = malloc((nnz + 1) * sizeof(int32_t));
    ok = pat->rowidx != NULL;
    for (int32_t q = 0; ok && q < np; ++q) {
      const int32_t others = (q + 1 < np ? list_at[q + 1] : (int32_t)listed) - list_at[q];
      for (int b = 0; b < 3; ++b) {
        const int32_t j = 3 * q + b;
        int32_t *out = pat->rowidx + pat->colptr[j];
        for (int32_t c = 0; c < others; ++c) {
          const int32_t p = lists[list_at[q] + c];
          *out++ = 3 * p, *out++ = 3 * p + 1, *out++ = 3 * p + 2;
        }
        for (int32_t row = pat->colptr[j + 1] - pat->colptr[j] - 3 * others; row > 0; --row) *out++ = j + 1 - row;
      }
    }
    /* each entry's place, in build_by_entries' visiting order (groups, kept elements, a, b),
     * from its element's table of pair ranks */
    int64_t q_entry = 0, element = 0;
    t = 0;
    if (ok)
      FOR_EACH_PAIR(groups, n_groups, n, table[pair_i * s_ + pair_j] = rank[t++], {
        for (int64_t a = 0; a < k_; ++a)
          for (int64_t b = 0; b < k_; ++b)
            if (r_[a] <= r_[b] && r_[b] < n) {
              pat->scatter[q_entry] = pat->colptr[r_[b]] + 3 * table[(a / 3) * s_ + b / 3] + r_[a] % 3;
              pat->offset[q_entry++] = (uint16_t)(a * k_ + b);
              ++pat->kept[element];
            }
        ++element;
      });
  }
  free(pair_p), free(pair_q), free(rank), free(by_p), free(by_id), free(start), free(fill), free(seen), free(slot);
  free(distinct), free(lists), free(list_at), free(table);
  if (!ok) {
    if (pat) pat->signature = NULL, free_pattern(pat);
    return NULL;
  }
  pat->signature = sig, pat->signature_len = sig_len;
  return pat;
}

/* The pattern of the kept entries (the first call's): by particles where the rows allow it. */
static Pattern *build_pattern(const Group *groups, int n_groups, int32_t n, int32_t *sig, size_t sig_len) {
  return rows_are_triples(groups, n_groups, n) ? build_by_particles(groups, n_groups, n, sig, sig_len)
                                               : build_by_entries(groups, n_groups, n, sig, sig_len);
}

/* For tests (tests/test_sparse.py): the pattern of these groups (E[g] elements of k[g] rows
 * and blocks each, over n DOFs) built both ways. 0: build_by_particles' equals
 * build_by_entries' in every array; 1: the rows are not in particle triples (only
 * build_by_entries applies); 2: they differ; 3: a block read is not finite; -1: no memory. */
int ipcjax_pattern_selfcheck(int32_t n, int n_groups, const int64_t *E, const int64_t *k, const int32_t *const *rows,
                             const double *const *blocks) {
  int64_t n_elements = 0;
  for (int gi = 0; gi < n_groups; ++gi) n_elements += E[gi];
  Group *groups = malloc((n_groups + 1) * sizeof *groups);
  uint8_t *used = malloc(n_elements + 1);
  if (!groups || !used) return free(groups), free(used), -1;
  n_elements = 0;
  for (int gi = 0; gi < n_groups; ++gi)
    groups[gi] = (Group){rows[gi], blocks[gi], E[gi], k[gi], used + n_elements}, n_elements += E[gi];
  int result = mark_used(groups, n_groups, n) ? 0 : 3;
  if (result == 0 && !rows_are_triples(groups, n_groups, n)) result = 1;
  if (result == 0) {
    size_t len_a = 0, len_b = 0;
    int32_t *sig_a = signature(groups, n_groups, n, &len_a), *sig_b = signature(groups, n_groups, n, &len_b);
    Pattern *a = sig_a ? build_by_entries(groups, n_groups, n, sig_a, len_a) : NULL;
    Pattern *b = sig_b ? build_by_particles(groups, n_groups, n, sig_b, len_b) : NULL;
    if (!a || !b) {
      result = -1;
      if (!a) free(sig_a);
      if (!b) free(sig_b);
    } else {
      int64_t n_used = 0, entries = 0;
      for (int64_t e = 0; e < n_elements; ++e) n_used += used[e];
      for (int64_t e = 0; e < n_used; ++e) entries += a->kept[e];
      if (a->nnz != b->nnz || memcmp(a->colptr, b->colptr, (n + 1) * sizeof(int32_t)) ||
          memcmp(a->rowidx, b->rowidx, a->nnz * sizeof(int32_t)) || memcmp(a->diag_at, b->diag_at, n * sizeof(int32_t)) ||
          memcmp(a->kept, b->kept, n_used * sizeof(int32_t)) ||
          memcmp(a->scatter, b->scatter, entries * sizeof(int32_t)) ||
          memcmp(a->offset, b->offset, entries * sizeof(uint16_t)))
        result = 2;
    }
    if (a) free_pattern(a);
    if (b) free_pattern(b);
  }
  free(groups), free(used);
  return result;
}

/* LDL^T of C = P H P^T without pivoting (H's upper triangle in pat and x; perm[k] is the
 * k-th pivot's index in H): the status, and when SUCCESSFUL the solution of H u = b in u.
 * Up-looking, row k of L from the elimination tree's reach of column k of C. -1: no memory. */
static int ldl_solve(int32_t n, const Pattern *pat, const double *x, const int32_t *perm, const double *b,
                     double *u) {
  const int64_t nnz = pat->nnz;
  int32_t *inv = malloc(n * sizeof *inv), *cp = calloc(n + 1, sizeof *cp), *ci = malloc(nnz * sizeof *ci);
  int32_t *parent = malloc(n * sizeof *parent), *mark = malloc(n * sizeof *mark), *used = calloc(n, sizeof *used);
  int32_t *stack = malloc(n * sizeof *stack), *path = malloc(n * sizeof *path), *fill = malloc(n * sizeof *fill);
  int64_t *lp = calloc(n + 1, sizeof *lp), *lnz = calloc(n, sizeof *lnz);
  double *cx = malloc(nnz * sizeof *cx), *d = malloc(n * sizeof *d), *y = calloc(n, sizeof *y);
  double *z = malloc(n * sizeof *z);
  int32_t *li = NULL;
  double *lx = NULL;
  int status = -1;
  if (!inv || !cp || !ci || !parent || !mark || !used || !stack || !path || !fill || !lp || !lnz || !cx || !d || !y ||
      !z)
    goto done;
  for (int32_t k = 0; k < n; ++k) inv[perm[k]] = k;
  for (int32_t j = 0; j < n; ++j)
    for (int32_t q = pat->colptr[j]; q < pat->colptr[j + 1]; ++q) {
      const int32_t a = inv[pat->rowidx[q]], c = inv[j];
      ++cp[(a > c ? a : c) + 1];
    }
  for (int32_t j = 0; j < n; ++j) cp[j + 1] += cp[j], fill[j] = cp[j];
  for (int32_t j = 0; j < n; ++j)
    for (int32_t q = pat->colptr[j]; q < pat->colptr[j + 1]; ++q) {
      const int32_t a = inv[pat->rowidx[q]], c = inv[j];
      const int32_t p = fill[a > c ? a : c]++;
      ci[p] = a < c ? a : c;
      cx[p] = x[q];
    }
  /* elimination tree and column counts of L */
  for (int32_t j = 0; j < n; ++j) {
    parent[j] = -1, mark[j] = j;
    for (int32_t p = cp[j]; p < cp[j + 1]; ++p)
      for (int32_t i = ci[p]; i < j && mark[i] != j; i = parent[i]) {
        if (parent[i] == -1) parent[i] = j;
        ++lnz[i];
        mark[i] = j;
      }
  }
  for (int32_t j = 0; j < n; ++j) lp[j + 1] = lp[j] + lnz[j], mark[j] = -1;
  li = malloc((lp[n] + 1) * sizeof *li), lx = malloc((lp[n] + 1) * sizeof *lx);
  if (!li || !lx) goto done;
  for (int32_t k = 0; k < n; ++k) {
    int32_t top = n;
    double dk = 0.0;
    mark[k] = k;
    for (int32_t p = cp[k]; p < cp[k + 1]; ++p) {
      int32_t i = ci[p], len = 0;
      if (i == k) {
        dk += cx[p];
        continue;
      }
      y[i] += cx[p];
      for (; mark[i] != k; i = parent[i]) path[len++] = i, mark[i] = k;
      while (len > 0) stack[--top] = path[--len];
    }
    for (; top < n; ++top) { /* the reach, in topological order */
      const int32_t i = stack[top];
      const double yi = y[i];
      y[i] = 0.0;
      for (int64_t p = lp[i]; p < lp[i] + used[i]; ++p) y[li[p]] -= lx[p] * yi;
      const double lki = yi / d[i];
      dk -= lki * yi;
      const int64_t p = lp[i] + used[i]++;
      li[p] = k, lx[p] = lki;
    }
    if (dk == 0.0 || !isfinite(dk)) {
      status = kSingular;
      goto done;
    }
    d[k] = dk;
  }
  status = kSuccessful;
  for (int32_t k = 0; k < n; ++k)
    if (d[k] < 0.0) status = kNotPositiveDefinite;
  if (status == kSuccessful) {
    for (int32_t k = 0; k < n; ++k) z[k] = b[perm[k]];
    for (int32_t j = 0; j < n; ++j)
      for (int64_t p = lp[j]; p < lp[j + 1]; ++p) z[li[p]] -= lx[p] * z[j];
    for (int32_t j = 0; j < n; ++j) z[j] /= d[j];
    for (int32_t j = n - 1; j >= 0; --j)
      for (int64_t p = lp[j]; p < lp[j + 1]; ++p) z[j] -= lx[p] * z[li[p]];
    for (int32_t k = 0; k < n; ++k) u[perm[k]] = z[k];
  }
done:
  free(inv), free(cp), free(ci), free(parent), free(mark), free(used), free(stack), free(path), free(fill);
  free(lp), free(lnz), free(cx), free(d), free(y), free(z), free(li), free(lx);
  return status;
}

static XLA_FFI_Error *ffi_error(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *message) {
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = code;
  return api->XLA_FFI_Error_Create(&args);
}

static const XLA_FFI_Buffer *buffer(void **list, const void *types, int64_t i, int is_ret) {
  const int type = is_ret ? (int)((const XLA_FFI_RetType *)types)[i] : (int)((const XLA_FFI_ArgType *)types)[i];
  return type == 1 ? (const XLA_FFI_Buffer *)list[i] : NULL; /* XLA_FFI_{Arg,Ret}Type_BUFFER */
}

/* The factorization and solve of one assembled matrix x (pattern pat): the status. */
static int solve_assembled(int32_t n, Pattern *pat, double *x, const double *b, double *u, int name_failure,
                           const char **error) {
  CholmodSparse A = {(size_t)n, (size_t)n, (size_t)pat->nnz, pat->colptr, pat->rowidx, NULL, x, NULL,
                     kUpper, kInt, kReal, kDouble, 1, 1};
  if (!pat->L && !(pat->L = cholmod_analyze(&A, common))) {
    *error = "ipcjax_cholmod_solve: CHOLMOD's analysis failed (out of memory?)";
    return -1;
  }
  if (!cholmod_factorize(&A, pat->L, common)) {
    *error = "ipcjax_cholmod_solve: CHOLMOD's factorization failed (out of memory?)";
    return -1;
  }
  const CholmodFactorHead *head = pat->L;
  if (head->minor < (size_t)n && !name_failure) return kNotPositiveDefinite;
  if (head->minor < (size_t)n) { /* a pivot <= 0: name it by LDL^T */
    int32_t *identity = NULL;
    const int32_t *perm = head->Perm;
    if (!perm) {
      if (!(identity = malloc(n * sizeof *identity))) return *error = "ipcjax_cholmod_solve: out of memory", -1;
      for (int32_t k = 0; k < n; ++k) identity[k] = k;
      perm = identity;
    }
    const int s = ldl_solve(n, pat, x, perm, b, u);
    free(identity);
    if (s < 0) *error = "ipcjax_cholmod_solve: out of memory";
    return s;
  }
  double *bx = malloc(n * sizeof *bx);
  if (!bx) return *error = "ipcjax_cholmod_solve: out of memory", -1;
  memcpy(bx, b, n * sizeof *bx);
  CholmodDense B = {(size_t)n, 1, (size_t)n, (size_t)n, bx, NULL, kReal, kDouble};
  void *X = cholmod_solve(kSolveA, pat->L, &B, common);
  free(bx);
  if (!X) return *error = "ipcjax_cholmod_solve: CHOLMOD's solve failed (out of memory?)", -1;
  memcpy(u, ((CholmodDense *)X)->x, n * sizeof *u);
  cholmod_free_dense(&X, common);
  return kSuccessful;
}

static XLA_FFI_Error *cholmod_call(XLA_FFI_CallFrame *frame, int name_failure) {
  const XLA_FFI_Api *api = frame->api;
  if (frame->extension_start && frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    XLA_FFI_Metadata *meta = ((XLA_FFI_Metadata_Extension *)frame->extension_start)->metadata;
    meta->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    meta->api_version.extension_start = NULL;
    meta->api_version.major_version = XLA_FFI_API_MAJOR;
    meta->api_version.minor_version = XLA_FFI_API_MINOR;
    meta->traits = 0;
    return NULL;
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
    return ffi_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "ipcjax_cholmod_solve: called outside execution");
  if (ipcjax_cholmod_check()[0]) return ffi_error(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, why);

  const int64_t n_args = frame->args.size;
  const XLA_FFI_Buffer *dbuf = n_args >= 2 ? buffer(frame->args.args, frame->args.types, 0, 0) : NULL;
  const XLA_FFI_Buffer *bbuf = n_args >= 2 ? buffer(frame->args.args, frame->args.types, 1, 0) : NULL;
  const XLA_FFI_Buffer *ubuf = frame->rets.size == 2 ? buffer(frame->rets.rets, frame->rets.types, 0, 1) : NULL;
  const XLA_FFI_Buffer *sbuf = frame->rets.size == 2 ? buffer(frame->rets.rets, frame->rets.types, 1, 1) : NULL;
  if (!dbuf || !bbuf || !ubuf || !sbuf || n_args % 2 != 0 || dbuf->dtype != XLA_FFI_DataType_F64 ||
      bbuf->dtype != XLA_FFI_DataType_F64 || ubuf->dtype != XLA_FFI_DataType_F64 ||
      sbuf->dtype != XLA_FFI_DataType_S32 || dbuf->rank != 1 || bbuf->rank != 1 || ubuf->rank != 1 ||
      sbuf->rank != 0 || bbuf->dims[0] != dbuf->dims[0] || ubuf->dims[0] != dbuf->dims[0])
    return ffi_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                     "ipcjax_cholmod_solve: takes d (n) f64, b (n) f64, then rows (E, k) s32 and blocks (E, k, k) "
                     "f64 per group, and returns u (n) f64 and a scalar s32 status");
  const int32_t n = (int32_t)dbuf->dims[0];
  const int n_groups = (int)((n_args - 2) / 2);
  Group *groups = malloc((n_groups + 1) * sizeof *groups);
  int64_t n_elements = 0;
  for (int gi = 0; gi < n_groups; ++gi) {
    const XLA_FFI_Buffer *r = buffer(frame->args.args, frame->args.types, 2 + 2 * gi, 0);
    n_elements += r && r->rank >= 1 ? r->dims[0] : 0;
  }
  uint8_t *used = malloc(n_elements + 1);
  if (!groups || !used) {
    free(groups), free(used);
    return ffi_error(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "ipcjax_cholmod_solve: out of memory");
  }
  n_elements = 0;
  for (int gi = 0; gi < n_groups; ++gi) {
    const XLA_FFI_Buffer *r = buffer(frame->args.args, frame->args.types, 2 + 2 * gi, 0);
    const XLA_FFI_Buffer *B = buffer(frame->args.args, frame->args.types, 3 + 2 * gi, 0);
    if (!r || !B || r->dtype != XLA_FFI_DataType_S32 || B->dtype != XLA_FFI_DataType_F64 || r->rank != 2 ||
        B->rank != 3 || B->dims[0] != r->dims[0] || B->dims[1] != r->dims[1] || B->dims[2] != r->dims[1] ||
        r->dims[1] > 255) {
      free(groups), free(used);
      return ffi_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                       "ipcjax_cholmod_solve: a group's rows must be (E, k) s32 and its blocks (E, k, k) f64, k <= 255");
    }
    groups[gi] = (Group){r->data, B->data, r->dims[0], r->dims[1], used + n_elements};
    n_elements += r->dims[0];
  }
  const double *d = dbuf->data, *b = bbuf->data;
  double *u = ubuf->data;
  int32_t *status = sbuf->data;

  int s = kSuccessful;
  for (int32_t j = 0; j < n && s == kSuccessful; ++j)
    if (!isfinite(d[j]) || !isfinite(b[j])) s = kNonFiniteInput;
  if (!mark_used(groups, n_groups, n)) s = kNonFiniteInput;
  const char *error = NULL;
  if (s == kSuccessful) {
    pthread_mutex_lock(&cache_mutex);
    size_t sig_len = 0;
    int32_t *sig = signature(groups, n_groups, n, &sig_len);
    Pattern *pat = NULL;
    for (int i = 0; sig && i < n_patterns && !pat; ++i)
      if (patterns[i]->signature_len == sig_len && !memcmp(patterns[i]->signature, sig, sig_len * sizeof *sig))
        pat = patterns[i];
    if (pat || !sig) {
      free(sig);
    } else if ((pat = build_pattern(groups, n_groups, n, sig, sig_len))) {
      if (n_patterns == kPatternsKept) {
        free_pattern(patterns[0]);
        memmove(patterns, patterns + 1, (kPatternsKept - 1) * sizeof *patterns);
        --n_patterns;
      }
      patterns[n_patterns++] = pat;
    } else {
      free(sig);
    }
    double *x = pat ? calloc(pat->nnz, sizeof *x) : NULL;
    if (!x) {
      error = "ipcjax_cholmod_solve: out of memory";
    } else {
      /* FOR_EACH_ENTRY's entries in its order, from the pattern's offsets: no tests */
      int64_t t = 0, element = 0;
      for (int gi = 0; gi < n_groups; ++gi) {
        const Group *g = &groups[gi];
        const int64_t kk = g->k * g->k;
        for (int64_t e = 0; e < g->E; ++e) {
          if (!g->used[e]) continue;
          const double *B = g->blocks + e * kk;
          for (const int64_t end = t + pat->kept[element++]; t < end; ++t) x[pat->scatter[t]] += B[pat->offset[t]];
        }
      }
      for (int32_t j = 0; j < n; ++j) x[pat->diag_at[j]] += d[j];
      s = solve_assembled(n, pat, x, b, u, name_failure, &error);
      free(x);
    }
    pthread_mutex_unlock(&cache_mutex);
  }
  free(groups), free(used);
  if (error) return ffi_error(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, error);
  for (int32_t j = 0; j < n && s == kSuccessful; ++j)
    if (!isfinite(u[j])) s = kSingular;
  if (s != kSuccessful)
    for (int32_t j = 0; j < n; ++j) u[j] = NAN;
  *status = s;
  return NULL;
}

XLA_FFI_Error *IpcjaxCholmodSolve(XLA_FFI_CallFrame *frame) { return cholmod_call(frame, 1); }

XLA_FFI_Error *IpcjaxCholmodTry(XLA_FFI_CallFrame *frame) { return cholmod_call(frame, 0); }
