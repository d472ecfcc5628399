/* RESP for the L1 table's plain path: the reply buffer, the requests it parses and the
 * replies it writes, straight from and into bytes.
 *
 * Included once, by _l1table.c (the extension is that one translation unit), so the
 * compiler sees these functions exactly as if they were written there: no call crosses a
 * file and nothing is copied on the way. This file knows the wire format only; which
 * commands are plain, and what they do to the table, is _l1table.c's (`Table.run`). */

#ifndef ARCA_RESP_H
#define ARCA_RESP_H

#include <Python.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>

/* ---------------------------------------------------------------- the reply buffer */

typedef struct {
    char *data;
    size_t cap;
} RespOut;

static int
out_reserve(RespOut *b, size_t *len, size_t extra)
{
    if (*len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < *len + extra)
        cap *= 2;
    char *out = PyMem_Realloc(b->data, cap);
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = out;
    b->cap = cap;
    return 0;
}

/* A reply or batch bigger than this is not kept for reuse (the next one reallocates). */
#define OUT_KEEP (1 << 20)

static void
out_trim(RespOut *b)
{
    if (b->cap > OUT_KEEP) {
        PyMem_Free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
}

/* ---------------------------------------------------------------- requests */

/* A canonical RESP length ("0" or digits without a leading zero, at most 18 of them) ending
 * in CRLF, starting at p; returns the position after the CRLF or NULL. */
static const char *
parse_length(const char *p, const char *end, long long *value)
{
    const char *start = p;
    long long v = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - start == 18)
            return NULL; /* a 19th digit: refused before it could overflow */
        v = v * 10 + (*p - '0');
        p++;
    }
    if (p == start || (*start == '0' && p - start > 1) || end - p < 2 || p[0] != '\r' || p[1] != '\n')
        return NULL;
    *value = v;
    return p + 2;
}

/* One `$len\r\n<bytes>\r\n` item; returns the position after it or NULL. */
static const char *
parse_bulk(const char *p, const char *end, long long max_bulk, const char **data, Py_ssize_t *len)
{
    long long n;
    if (p >= end || *p != '$' || (p = parse_length(p + 1, end, &n)) == NULL || n > max_bulk)
        return NULL;
    if (end - p < n + 2 || p[n] != '\r' || p[n + 1] != '\n')
        return NULL;
    *data = p;
    *len = (Py_ssize_t)n;
    return p + n + 2;
}

/* Whether data[0:len] is the command name `upper` (upper case, ASCII letters), any case. */
static inline int
name_is(const char *data, Py_ssize_t len, const char *upper)
{
    Py_ssize_t i = 0;
    for (; upper[i]; i++)
        if (i >= len || (data[i] & 0xdf) != upper[i])
            return 0;
    return i == len;
}

/* A signed 64-bit integer written as Redis's string2ll accepts it (optional '-', digits, no
 * leading zero, no "-0", in range); 0 when it is not one. */
static int
parse_ll(const char *data, Py_ssize_t len, long long *out)
{
    if (len < 1 || len > 20)
        return 0;
    Py_ssize_t i = data[0] == '-' && len > 1;
    if (data[i] == '0' && len > 1)
        return 0;
    unsigned long long v = 0;
    for (Py_ssize_t j = i; j < len; j++) {
        if (data[j] < '0' || data[j] > '9' || v > (ULLONG_MAX - 9) / 10)
            return 0;
        v = v * 10 + (unsigned long long)(data[j] - '0');
    }
    if (i) {
        if (v > (unsigned long long)LLONG_MAX + 1)
            return 0;
        *out = v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v;
    } else {
        if (v > (unsigned long long)LLONG_MAX)
            return 0;
        *out = (long long)v;
    }
    return 1;
}

/* ---------------------------------------------------------------- replies */

/* The decimal digits of v at out (no terminator); returns how many. sprintf cost about 15%
 * of the server's CPU on pipelined GETs. */
static size_t
format_ll(char *out, long long v)
{
    char digits[20];
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    size_t n = 0, len = 0;
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        out[len++] = '-';
    while (n)
        out[len++] = digits[--n];
    return len;
}

/* `<prefix><v>\r\n` at out (at most 23 bytes); returns its length. */
static size_t
format_line(char *out, char prefix, long long v)
{
    out[0] = prefix;
    size_t len = 1 + format_ll(out + 1, v);
    out[len++] = '\r';
    out[len++] = '\n';
    return len;
}

static int
reply_bytes(RespOut *b, size_t *len, const char *text, size_t n)
{
    if (out_reserve(b, len, n) < 0)
        return -1;
    memcpy(b->data + *len, text, n);
    *len += n;
    return 0;
}

/* `$<n>\r\n<data>\r\n`: a bulk string, copied from where it lies (an entry of the table). */
static inline int
reply_bulk(RespOut *b, size_t *len, const char *data, Py_ssize_t n)
{
    if (out_reserve(b, len, (size_t)n + 32) < 0)
        return -1;
    *len += format_line(b->data + *len, '$', n);
    memcpy(b->data + *len, data, (size_t)n);
    *len += (size_t)n;
    b->data[(*len)++] = '\r';
    b->data[(*len)++] = '\n';
    return 0;
}

#endif /* ARCA_RESP_H */
