/* twostage_eval.c: `ntpref eval` of the two-stage transformer (docs/twostage.md §2-§3) in plain C, an
 * example of an implementation checked by `ntpref conformance --command` (docs/conformance.md, "Any
 * language: --command"):
 *
 *   cc -O2 -o twostage_eval "$(ntpref adapters c-twostage-eval)" -lm
 *   ntpref conformance --command './twostage_eval {kind} {input_dir} {output_dir}' --model twostage --kind eval
 *
 * Usage: twostage_eval KIND INPUT_DIR OUTPUT_DIR. INPUT_DIR holds one NAME.npy file per input array
 * (docs/contract.md): model (0-d string), tokens [N, Lmax], lengths [N], targets [N] (int64, tokens -1 past
 * each length), W_ov, W_kq [d, d] (float64), the embeddings E [d, K] (float64) or K (0-d int64: E = I_K),
 * and optionally succ [K] (int64). The outputs go to OUTPUT_DIR as loss, logits [N, K], attn [N, Lmax],
 * grad_W_ov, grad_W_kq and, with succ, loss0 and grad0_W_ov. Only C-order little-endian '<f8' / '<i8'
 * arrays and 0-d '<U' strings (UTF-32 little-endian code points, padded with NULs) of .npy format 1.0 or
 * 2.0 are read. Exit status 0 done, 2 an input it cannot use (one line on stderr), 3 (ntpref's "not
 * implemented") for anything but a two-stage eval.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BAD_INPUT = 2, NOT_IMPLEMENTED = 3 };

typedef struct {
    int ndim;
    long shape[2];
    long size;   /* number of entries */
    void *data;  /* double or int64_t */
} Array;

/* The data of one evaluation: N sentences padded to Lmax, K tokens embedded in R^d. */
typedef struct {
    long N, Lmax, K, d;
    const int64_t *tokens, *lengths, *targets;
    const double *E, *W_ov, *W_kq; /* E [d, K], W [d, d], row-major */
} Problem;

#define EMB(P, r, v) ((P)->E[(r) * (P)->K + (v)])

static const char *input_dir, *output_dir;

static void die(int status, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    fputs("twostage_eval: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(status);
}

static void *allocate(long count, size_t size)
{
    void *p = calloc(count > 0 ? (size_t)count : 1, size);
    if (!p)
        die(BAD_INPUT, "out of memory (%ld entries)", count);
    return p;
}

/* The text after `key` in a .npy header, spaces skipped. */
static const char *field(const char *header, const char *key, const char *path)
{
    const char *p = strstr(header, key);
    if (!p)
        die(BAD_INPUT, "%s: the .npy header has no %s", path, key);
    for (p += strlen(key); *p == ' '; p++)
        ;
    return p;
}

/* An open INPUT_DIR/NAME.npy: its path, the file positioned at the data and the header, a Python dict
 * literal such as {'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), } padded with spaces. */
typedef struct {
    char path[4096];
    FILE *file;
    char *header;
} Npy;

/* Open INPUT_DIR/NAME.npy and read its header. Returns 0, opening nothing, when the file does not exist and
 * `optional` is set. The file starts with the 6 bytes \x93NUMPY, the version (1 0 or 2 0), the header
 * length as 2 (version 1.0) or 4 (2.0) little-endian bytes, then the header. */
static int npy_open(const char *name, int optional, Npy *npy)
{
    snprintf(npy->path, sizeof npy->path, "%s/%s.npy", input_dir, name);
    const char *path = npy->path;
    FILE *f = npy->file = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT)
            return 0;
        die(BAD_INPUT, "%s: %s", path, strerror(errno));
    }
    unsigned char start[12];
    if (fread(start, 1, 8, f) != 8 || memcmp(start, "\x93NUMPY", 6) != 0)
        die(BAD_INPUT, "%s: not a .npy file", path);
    int width = start[6] == 1 ? 2 : start[6] == 2 ? 4 : 0;
    if (!width || start[7] != 0)
        die(BAD_INPUT, "%s: .npy format %d.%d (1.0 and 2.0 are read)", path, start[6], start[7]);
    if (fread(start + 8, 1, width, f) != (size_t)width)
        die(BAD_INPUT, "%s: truncated .npy header", path);
    unsigned long length = 0;
    for (int i = width - 1; i >= 0; i--)
        length = length << 8 | start[8 + i];
    if (length > 65536)
        die(BAD_INPUT, "%s: a .npy header of %lu bytes", path, length);
    npy->header = allocate(length + 1, 1);
    if (fread(npy->header, 1, length, f) != length)
        die(BAD_INPUT, "%s: truncated .npy header", path);
    if (strncmp(field(npy->header, "'fortran_order':", path), "False", 5) != 0)
        die(BAD_INPUT, "%s: not in C order", path);
    return 1;
}

/* The shape in the header of `npy` (at most two dimensions) into a->ndim, a->shape, a->size. */
static void npy_shape(const Npy *npy, Array *a)
{
    const char *p = field(npy->header, "'shape':", npy->path);
    if (*p++ != '(')
        die(BAD_INPUT, "%s: malformed shape in the .npy header", npy->path);
    a->ndim = 0;
    a->size = 1;
    while (*p != ')') {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 0 || a->ndim == 2)
            die(BAD_INPUT, "%s: malformed shape (or more than 2 dimensions) in the .npy header", npy->path);
        a->shape[a->ndim++] = n;
        a->size *= n;
        for (p = end; *p == ',' || *p == ' '; p++)
            ;
    }
}

/* Read exactly `count` items of `size` bytes, then the end of the file, and close it. */
static void npy_data(Npy *npy, void *data, long count, size_t size)
{
    if (fread(data, size, count, npy->file) != (size_t)count || fgetc(npy->file) != EOF)
        die(BAD_INPUT, "%s: the data is not exactly %ld entries of %zu bytes", npy->path, count, size);
    fclose(npy->file);
    free(npy->header);
}

/* Read INPUT_DIR/NAME.npy, of dtype '<f8' (float_type) or '<i8' and at most two dimensions. Returns 0,
 * reading nothing, when the file does not exist and `optional` is set. */
static int load(const char *name, int float_type, int optional, Array *a)
{
    Npy npy;
    if (!npy_open(name, optional, &npy))
        return 0;
    const char *want = float_type ? "'<f8'" : "'<i8'";
    if (strncmp(field(npy.header, "'descr':", npy.path), want, 5) != 0)
        die(BAD_INPUT, "%s: dtype is not %s", npy.path, want);
    npy_shape(&npy, a);
    a->data = allocate(a->size, 8);
    npy_data(&npy, a->data, a->size, 8);
    return 1;
}

/* Read the string INPUT_DIR/NAME.npy into `text` (UTF-8, NUL-terminated, at most `room` bytes with the NUL).
 * A string option is a 0-d array of dtype '<Un': n code points of 4 bytes each, little-endian (UTF-32LE),
 * the string followed by NUL code points up to n (n is the longest string of the array, here its only one). */
static void load_string(const char *name, char *text, size_t room)
{
    Npy npy;
    Array shape;
    npy_open(name, 0, &npy);
    const char *p = field(npy.header, "'descr':", npy.path);
    char *end = NULL;
    long n = strncmp(p, "'<U", 3) == 0 ? strtol(p + 3, &end, 10) : -1;
    if (n < 1 || *end != '\'')
        die(BAD_INPUT, "%s: dtype is not a little-endian unicode string '<U...'", npy.path);
    npy_shape(&npy, &shape);
    if (shape.ndim != 0)
        die(BAD_INPUT, "array '%s': a string option is a 0-d array, this one has %d dimensions", name, shape.ndim);
    unsigned char *units = allocate(n, 4);
    npy_data(&npy, units, n, 4);
    size_t used = 0;
    for (long i = 0; i < n; i++) {
        const unsigned char *b = units + 4 * i;
        unsigned long c = b[0] | (unsigned long)b[1] << 8 | (unsigned long)b[2] << 16 | (unsigned long)b[3] << 24;
        if (c == 0)
            break; /* the padding */
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            die(BAD_INPUT, "array '%s': %#lx is not a unicode code point", name, c);
        static const unsigned char lead[5] = {0, 0x00, 0xC0, 0xE0, 0xF0}; /* UTF-8: by the number of bytes */
        unsigned char utf8[4];
        int bytes = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        utf8[0] = lead[bytes] | c >> 6 * (bytes - 1);
        for (int k = 1; k < bytes; k++)
            utf8[k] = 0x80 | (c >> 6 * (bytes - 1 - k) & 0x3F);
        if (used + bytes >= room)
            die(BAD_INPUT, "array '%s': a string of more than %zu bytes", name, room - 1);
        memcpy(text + used, utf8, bytes);
        used += bytes;
    }
    text[used] = 0;
    free(units);
}

/* Stop unless `a` (input NAME) has `ndim` dimensions and the given sizes (-1: any). */
static void need(const Array *a, const char *name, int ndim, long n0, long n1)
{
    long want[2] = {n0, n1};
    int ok = a->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = want[i] < 0 || a->shape[i] == want[i];
    if (!ok)
        die(BAD_INPUT, "array '%s': shape of %d dimensions, expected %d (sizes %ld, %ld; -1 any)", name, a->ndim,
            ndim, n0, n1);
}

/* Write OUTPUT_DIR/NAME.npy: float64, C order, shape () / (n0,) / (n0, n1) for ndim 0 / 1 / 2. */
static void save(const char *name, const double *x, int ndim, long n0, long n1)
{
    char path[4096], shape[64], header[256];
    if (ndim == 0)
        snprintf(shape, sizeof shape, "()");
    else if (ndim == 1)
        snprintf(shape, sizeof shape, "(%ld,)", n0);
    else
        snprintf(shape, sizeof shape, "(%ld, %ld)", n0, n1);
    int length = snprintf(header, sizeof header, "{'descr': '<f8', 'fortran_order': False, 'shape': %s, }", shape);
    int pad = (64 - (10 + length + 1) % 64) % 64; /* data starts at a multiple of 64 bytes */
    memset(header + length, ' ', pad);
    length += pad;
    header[length++] = '\n';
    long count = ndim == 0 ? 1 : ndim == 1 ? n0 : n0 * n1;
    unsigned char prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, length & 0xff, length >> 8};
    snprintf(path, sizeof path, "%s/%s.npy", output_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(prefix, 1, 10, f) != 10 || fwrite(header, 1, length, f) != (size_t)length
        || fwrite(x, 8, count, f) != (size_t)count || fclose(f) != 0)
        die(BAD_INPUT, "%s: cannot write (%s)", path, strerror(errno));
}

/* One sentence tok[0..L-1] with target y, weighted by w in the loss: writes its logits z [K] and attention
 * phi [L], adds w·∂ℓ/∂W_ov to g_ov and (unless g_kq is NULL) w·∂ℓ/∂W_kq to g_kq; returns ℓ = −log p_y.
 * `work` holds 6d + 2L + K doubles. */
static double sentence(const Problem *P, const int64_t *tok, long L, long y, double w, double *z, double *phi,
                       double *g_ov, double *g_kq, double *work)
{
    const long d = P->d, K = P->K, q = tok[L - 1];
    double *u = work, *h = u + d, *o = h + d, *e = o + d, *b = e + d, *t = b + d, *a = t + d, *gs = a + L,
           *gz = gs + L;

    /* attention: s_l = x_lᵀ W_kq x_q, φ = softmax(s) with the largest score subtracted */
    for (long r = 0; r < d; r++) {
        u[r] = 0;
        for (long c = 0; c < d; c++)
            u[r] += P->W_kq[r * d + c] * EMB(P, c, q);
    }
    double s_max = -INFINITY, total = 0;
    for (long l = 0; l < L; l++) {
        phi[l] = 0;
        for (long r = 0; r < d; r++)
            phi[l] += EMB(P, r, tok[l]) * u[r];
        s_max = fmax(s_max, phi[l]);
    }
    for (long l = 0; l < L; l++)
        total += phi[l] = exp(phi[l] - s_max);
    for (long l = 0; l < L; l++)
        phi[l] /= total;

    /* logits z = Eᵀ W_ov X φ */
    for (long r = 0; r < d; r++) {
        h[r] = 0;
        for (long l = 0; l < L; l++)
            h[r] += phi[l] * EMB(P, r, tok[l]);
    }
    for (long r = 0; r < d; r++) {
        o[r] = 0;
        for (long c = 0; c < d; c++)
            o[r] += P->W_ov[r * d + c] * h[c];
    }
    for (long v = 0; v < K; v++) {
        z[v] = 0;
        for (long r = 0; r < d; r++)
            z[v] += EMB(P, r, v) * o[r];
    }

    /* ℓ = log(1 + Σ_{v≠y} e^{r_v}) from the margins r_v = z_v − z_y; p_v = e^{r_v − ℓ}, and p_y − 1 is
     * −Σ_{v≠y} p_v (no cancellation) */
    double r_max = -INFINITY, sum = 0, loss = 0;
    for (long v = 0; v < K; v++)
        if (v != y)
            r_max = fmax(r_max, z[v] - z[y]);
    if (K > 1) {
        double shift = r_max > 0 ? r_max : 0;
        for (long v = 0; v < K; v++)
            if (v != y)
                sum += exp(z[v] - z[y] - shift);
        loss = shift > 0 ? shift + log(exp(-shift) + sum) : log1p(sum);
    }
    gz[y] = 0;
    for (long v = 0; v < K; v++)
        if (v != y) {
            gz[v] = exp(z[v] - z[y] - loss);
            gz[y] -= gz[v];
        }

    /* ∂ℓ/∂W_ov = (E g_z)(Xφ)ᵀ */
    for (long r = 0; r < d; r++) {
        e[r] = 0;
        for (long v = 0; v < K; v++)
            e[r] += EMB(P, r, v) * gz[v];
        for (long c = 0; c < d; c++)
            g_ov[r * d + c] += w * e[r] * h[c];
    }
    if (!g_kq)
        return loss;

    /* a = Xᵀ W_ovᵀ E g_z; g_s,l = φ_l (a_l − φ·a) = φ_l Σ_k φ_k (a_l − a_k); ∂ℓ/∂W_kq = X g_s x_qᵀ */
    for (long c = 0; c < d; c++) {
        b[c] = 0;
        for (long r = 0; r < d; r++)
            b[c] += P->W_ov[r * d + c] * e[r];
    }
    for (long l = 0; l < L; l++) {
        a[l] = 0;
        for (long c = 0; c < d; c++)
            a[l] += EMB(P, c, tok[l]) * b[c];
    }
    for (long l = 0; l < L; l++) {
        gs[l] = 0;
        for (long k = 0; k < L; k++)
            gs[l] += phi[k] * (a[l] - a[k]);
        gs[l] *= phi[l];
    }
    for (long r = 0; r < d; r++) {
        t[r] = 0;
        for (long l = 0; l < L; l++)
            t[r] += gs[l] * EMB(P, r, tok[l]);
        for (long c = 0; c < d; c++)
            g_kq[r * d + c] += w * t[r] * EMB(P, c, q);
    }
    return loss;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        die(BAD_INPUT, "usage: twostage_eval KIND INPUT_DIR OUTPUT_DIR");
    input_dir = argv[2];
    output_dir = argv[3];
    char model[64];
    load_string("model", model, sizeof model);
    if (strcmp(argv[1], "eval") != 0 || strcmp(model, "twostage") != 0)
        die(NOT_IMPLEMENTED, "only eval of model twostage is implemented, not %s of %s", argv[1], model);
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1)
        die(BAD_INPUT, "this example reads little-endian arrays on a little-endian machine only");

    Array tokens, lengths, targets, E, K, W_ov, W_kq, succ;
    Problem P;
    load("tokens", 0, 0, &tokens);
    need(&tokens, "tokens", 2, -1, -1);
    P.N = tokens.shape[0];
    P.Lmax = tokens.shape[1];
    load("lengths", 0, 0, &lengths);
    need(&lengths, "lengths", 1, P.N, -1);
    load("targets", 0, 0, &targets);
    need(&targets, "targets", 1, P.N, -1);
    if (load("E", 1, 1, &E)) {
        need(&E, "E", 2, -1, -1);
        P.d = E.shape[0];
        P.K = E.shape[1];
        P.E = E.data;
    } else {
        load("K", 0, 0, &K);
        need(&K, "K", 0, -1, -1);
        P.K = P.d = *(int64_t *)K.data;
        if (P.K < 1)
            die(BAD_INPUT, "array 'K': %ld is not >= 1", P.K);
        double *identity = allocate(P.K * P.K, sizeof(double));
        for (long v = 0; v < P.K; v++)
            identity[v * P.K + v] = 1;
        P.E = identity;
    }
    load("W_ov", 1, 0, &W_ov);
    need(&W_ov, "W_ov", 2, P.d, P.d);
    load("W_kq", 1, 0, &W_kq);
    need(&W_kq, "W_kq", 2, P.d, P.d);
    int has_succ = load("succ", 0, 1, &succ);
    if (has_succ)
        need(&succ, "succ", 1, P.K, -1);
    P.tokens = tokens.data;
    P.lengths = lengths.data;
    P.targets = targets.data;
    P.W_ov = W_ov.data;
    P.W_kq = W_kq.data;
    if (P.N < 1 || P.Lmax < 1 || P.K < 1 || P.d < 1)
        die(BAD_INPUT, "empty input (N %ld, Lmax %ld, K %ld, d %ld)", P.N, P.Lmax, P.K, P.d);
    for (long i = 0; i < P.N; i++) {
        if (P.lengths[i] < 1 || P.lengths[i] > P.Lmax)
            die(BAD_INPUT, "array 'lengths': %ld at index %ld is not in 1..%ld", (long)P.lengths[i], i, P.Lmax);
        if (P.targets[i] < 0 || P.targets[i] >= P.K)
            die(BAD_INPUT, "array 'targets': %ld at index %ld is not a token", (long)P.targets[i], i);
        for (long l = 0; l < P.lengths[i]; l++)
            if (P.tokens[i * P.Lmax + l] < 0 || P.tokens[i * P.Lmax + l] >= P.K)
                die(BAD_INPUT, "array 'tokens': entry (%ld, %ld) is not a token", i, l);
    }

    double *logits = allocate(P.N * P.K, sizeof(double)), *attn = allocate(P.N * P.Lmax, sizeof(double));
    double *g_ov = allocate(P.d * P.d, sizeof(double)), *g_kq = allocate(P.d * P.d, sizeof(double));
    double *work = allocate(6 * P.d + 2 * P.Lmax + P.K, sizeof(double)), loss = 0;
    for (long i = 0; i < P.N; i++)
        loss += sentence(&P, P.tokens + i * P.Lmax, P.lengths[i], P.targets[i], 1.0 / P.N, logits + i * P.K,
                         attn + i * P.Lmax, g_ov, g_kq, work);
    loss /= P.N;
    save("loss", &loss, 0, 0, 0);
    save("logits", logits, 2, P.N, P.K);
    save("attn", attn, 2, P.N, P.Lmax);
    save("grad_W_ov", g_ov, 2, P.d, P.d);
    save("grad_W_kq", g_kq, 2, P.d, P.d);
    if (!has_succ)
        return 0;

    /* L0: the one-token sentences [x] → succ[x] of every token x with a successor, weights uniform */
    const int64_t *next = succ.data;
    long count = 0;
    for (long x = 0; x < P.K; x++) {
        if (next[x] < -1 || next[x] >= P.K)
            die(BAD_INPUT, "array 'succ': %ld at index %ld is not -1 or a token", (long)next[x], x);
        count += next[x] >= 0;
    }
    if (count == 0)
        die(BAD_INPUT, "array 'succ': no token has a successor, so L0 is undefined");
    double *g0 = allocate(P.d * P.d, sizeof(double)), *z = allocate(P.K, sizeof(double)), phi, loss0 = 0;
    for (int64_t x = 0; x < P.K; x++)
        if (next[x] >= 0)
            loss0 += sentence(&P, &x, 1, next[x], 1.0 / count, z, &phi, g0, NULL, work);
    loss0 /= count;
    save("loss0", &loss0, 0, 0, 0);
    save("grad0_W_ov", g0, 2, P.d, P.d);
    return 0;
}
