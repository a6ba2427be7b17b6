/* sms._wire: the compiled implementation of sms/wire.py's hot functions.
 *
 * Each function here does what its namesake in sms/wire.py's pure-Python reference
 * does, with the same bytes, decisions and named errors (same class, same message):
 * tests/unit/test_wire_differential.py holds both to that. The Python module owns the
 * formats (see its docstring); this file only walks them without a Python object per
 * field. Per-batch work (checksums, the batch header) stays in Python: `verify` is
 * passed in by `configure` and called once per batch.
 *
 * MD5 (RFC 1321) is written out below: it routes partition keys to the hash space, as
 * in Kinesis. xxh3 comes from the vendored xxhash.h (BSD-2, sms/_native/), the same
 * version as the `xxhash` package, so signatures match the reference bit for bit.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "_native/xxhash.h"

/* ---- configuration: classes and limits handed over by sms/wire.py -------------------- */

static PyObject *RecordType, *PutEntryType, *SessionFieldsType;
static PyObject *ErrInvalidArgument, *ErrInvalidPartitionKey, *ErrInvalidRecordHeader, *ErrRecordTooLarge,
    *ErrRequestTooLarge, *ErrCorruptBatch, *VerifyFn;
static long long RECORD_DATA_BYTES_MAX, PARTITION_KEY_CHARS_MIN, PARTITION_KEY_CHARS_MAX, PUT_RECORDS_COUNT_MAX,
    PUT_RECORDS_BYTES_MAX, PRODUCER_ID_BYTES_MAX, DEDUP_KEY_BYTES_MAX, RECORD_HEADERS_MAX,
    RECORD_HEADER_NAME_BYTES_MAX, RECORD_HEADERS_BYTES_MAX, SESSION_KEY_BYTES_MAX;
static int configured = 0;

#define ENTRY_BYTES 8
#define HEADER_BYTES 56   /* sms.wire.HEADER_BYTES (batch version 3); sms.wire refuses a build that differs */
#define TAG_EXPLICIT_HASH_KEY 1
#define TAG_PRODUCER_ID 2
#define TAG_SSSN 3
#define TAG_DEDUP_KEY 4
#define TAG_SUBMIT_MS 5
#define TAG_SESSION_ORDINAL 6
#define LONG_TAG_MIN 0x80
#define TAG_HEADER 0x80

static int
limit_of(PyObject *limits, const char *name, long long *out)
{
    PyObject *v = PyObject_GetAttrString(limits, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *
configure(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"Record", "PutEntry", "SessionFields", "InvalidArgument", "InvalidPartitionKey",
                            "InvalidRecordHeader", "RecordTooLarge", "RequestTooLarge", "CorruptBatch", "verify",
                            "limits", NULL};
    PyObject *rec, *put, *sess, *ia, *ipk, *irh, *rtl, *rqtl, *cb, *verify, *limits;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OOOOOOOOOOO", names, &rec, &put, &sess, &ia, &ipk, &irh,
                                     &rtl, &rqtl, &cb, &verify, &limits))
        return NULL;
    if (!PyType_Check(rec) || !PyType_IsSubtype((PyTypeObject *)rec, &PyTuple_Type) || !PyType_Check(put) ||
        !PyType_IsSubtype((PyTypeObject *)put, &PyTuple_Type) || !PyType_Check(sess) ||
        !PyType_IsSubtype((PyTypeObject *)sess, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "Record, PutEntry and SessionFields must be tuple types");
        return NULL;
    }
    if (limit_of(limits, "RECORD_DATA_BYTES_MAX", &RECORD_DATA_BYTES_MAX) ||
        limit_of(limits, "PARTITION_KEY_CHARS_MIN", &PARTITION_KEY_CHARS_MIN) ||
        limit_of(limits, "PARTITION_KEY_CHARS_MAX", &PARTITION_KEY_CHARS_MAX) ||
        limit_of(limits, "PUT_RECORDS_COUNT_MAX", &PUT_RECORDS_COUNT_MAX) ||
        limit_of(limits, "PUT_RECORDS_BYTES_MAX", &PUT_RECORDS_BYTES_MAX) ||
        limit_of(limits, "PRODUCER_ID_BYTES_MAX", &PRODUCER_ID_BYTES_MAX) ||
        limit_of(limits, "DEDUP_KEY_BYTES_MAX", &DEDUP_KEY_BYTES_MAX) ||
        limit_of(limits, "RECORD_HEADERS_MAX", &RECORD_HEADERS_MAX) ||
        limit_of(limits, "RECORD_HEADER_NAME_BYTES_MAX", &RECORD_HEADER_NAME_BYTES_MAX) ||
        limit_of(limits, "RECORD_HEADERS_BYTES_MAX", &RECORD_HEADERS_BYTES_MAX) ||
        limit_of(limits, "SESSION_KEY_BYTES_MAX", &SESSION_KEY_BYTES_MAX))
        return NULL;
    PyObject **slots[] = {&RecordType, &PutEntryType, &SessionFieldsType, &ErrInvalidArgument,
                          &ErrInvalidPartitionKey, &ErrInvalidRecordHeader, &ErrRecordTooLarge, &ErrRequestTooLarge,
                          &ErrCorruptBatch, &VerifyFn};
    PyObject *values[] = {rec, put, sess, ia, ipk, irh, rtl, rqtl, cb, verify};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    configured = 1;
    Py_RETURN_NONE;
}

static int
check_configured(void)
{
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "sms._wire is not configured (import sms.wire)");
        return -1;
    }
    return 0;
}

/* Raise cls(message) where message is PyUnicode_FromFormatV(fmt, ...). Returns NULL. */
static PyObject *
raise_named(PyObject *cls, const char *fmt, ...)
{
    va_list vargs;
    va_start(vargs, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, vargs);
    va_end(vargs);
    if (msg == NULL)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(cls, msg);
    Py_DECREF(msg);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* ---- little helpers over bytes ---------------------------------------------------- */

static inline uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint16_t
le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void
put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static inline void
put_le16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
}

static inline void
put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) { p[i] = (unsigned char)v; v >>= 8; }
}

static inline void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline PyObject *
int_from_be128(const unsigned char *p)
{
    return _PyLong_FromByteArray(p, 16, 0, 0);
}

/* A growable output buffer. */
typedef struct {
    unsigned char *p;
    size_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    unsigned char *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

/* ---- MD5 (RFC 1321) ---------------------------------------------------------------- */

static const uint32_t MD5_K[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
static const unsigned char MD5_R[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                                        5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                                        4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                                        6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

static void
md5_block(uint32_t h[4], const unsigned char *block)
{
    uint32_t w[16];
    for (int i = 0; i < 16; i++)
        w[i] = le32(block + 4 * i);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 64; i++) {
        uint32_t f;
        int g;
        if (i < 16) { f = (b & c) | (~b & d); g = i; }
        else if (i < 32) { f = (d & b) | (~d & c); g = (5 * i + 1) & 15; }
        else if (i < 48) { f = b ^ c ^ d; g = (3 * i + 5) & 15; }
        else { f = c ^ (b | ~d); g = (7 * i) & 15; }
        uint32_t t = d;
        d = c;
        c = b;
        uint32_t x = a + f + MD5_K[i] + w[g];
        b = b + ((x << MD5_R[i]) | (x >> (32 - MD5_R[i])));
        a = t;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
}

static void
md5(const unsigned char *msg, size_t len, unsigned char out[16])
{
    uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
    size_t i = 0;
    for (; i + 64 <= len; i += 64)
        md5_block(h, msg + i);
    unsigned char tail[128];
    size_t rest = len - i;
    memcpy(tail, msg + i, rest);
    tail[rest] = 0x80;
    size_t padded = (rest + 1 + 8 <= 64) ? 64 : 128;
    memset(tail + rest + 1, 0, padded - rest - 1);
    uint64_t bits = (uint64_t)len * 8;
    for (int k = 0; k < 8; k++)
        tail[padded - 8 + k] = (unsigned char)(bits >> (8 * k));
    md5_block(h, tail);
    if (padded == 128)
        md5_block(h, tail + 64);
    for (int k = 0; k < 4; k++)
        put_le32(out + 4 * k, h[k]);
}

static PyObject *
hash_key_of(const unsigned char *key, size_t len)
{
    unsigned char digest[16];
    md5(key, len, digest);
    return int_from_be128(digest);
}

/* ---- signatures: xxh3-128 of <H key_len LE> key data headers ---------------------------- */

static void
signature_into(unsigned char out[16], const unsigned char *key, size_t key_len, const unsigned char *data,
               size_t data_len, const unsigned char *headers, size_t headers_len)
{
    XXH3_state_t state;
    unsigned char prefix[2];
    XXH128_canonical_t canon;
    XXH3_128bits_reset(&state);
    put_le16(prefix, (uint16_t)key_len);
    XXH3_128bits_update(&state, prefix, 2);
    XXH3_128bits_update(&state, key, key_len);
    XXH3_128bits_update(&state, data, data_len);
    if (headers_len)
        XXH3_128bits_update(&state, headers, headers_len);
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&state));
    memcpy(out, canon.digest, 16);
}

static PyObject *
signature_of(const unsigned char *key, size_t key_len, const unsigned char *data, size_t data_len,
             const unsigned char *headers, size_t headers_len)
{
    unsigned char digest[16];
    signature_into(digest, key, key_len, data, data_len, headers, headers_len);
    return PyBytes_FromStringAndSize((const char *)digest, 16);
}

static PyObject *
w_signature(PyObject *self, PyObject *args)
{
    Py_buffer key, data, headers = {0};
    if (!PyArg_ParseTuple(args, "y*y*|y*", &key, &data, &headers) || check_configured() < 0)
        return NULL;
    if (key.len > 0xFFFF) {
        raise_named(ErrInvalidArgument, "a key of %zd bytes has no signature; at most 65535", key.len);
        PyBuffer_Release(&key);
        PyBuffer_Release(&data);
        if (headers.obj)
            PyBuffer_Release(&headers);
        return NULL;
    }
    PyObject *out = signature_of(key.buf, key.len, data.buf, data.len, headers.buf, headers.buf ? headers.len : 0);
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    if (headers.obj)
        PyBuffer_Release(&headers);
    return out;
}

static PyObject *
w_hash_key(PyObject *self, PyObject *arg)
{
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = hash_key_of(key.buf, key.len);
    PyBuffer_Release(&key);
    return out;
}

/* ---- meta TLVs ---------------------------------------------------------------------- */

/* Next TLV of meta[*i..n): 1 with tag/value set, 0 at the end, -1 when truncated. */
static inline int
next_tlv(const unsigned char *meta, size_t n, size_t *i, int *tag, const unsigned char **value, size_t *len,
         size_t *start)
{
    if (*i >= n)
        return 0;
    *start = *i;
    *tag = meta[*i];
    if (*tag >= LONG_TAG_MIN) {
        if (*i + 3 > n)
            return -1;
        *len = ((size_t)meta[*i + 1] << 8) | meta[*i + 2];
        *i += 3;
    } else {
        if (*i + 2 > n)
            return -1;
        *len = meta[*i + 1];
        *i += 2;
    }
    if (*i + *len > n)
        return -1;
    *value = meta + *i;
    *i += *len;
    return 1;
}

/* The meta fields sms/wire.py names, by tag (a repeated tag: the last), and the raw
 * header TLVs in order. */
typedef struct {
    const unsigned char *v[TAG_SESSION_ORDINAL + 1];
    size_t len[TAG_SESSION_ORDINAL + 1];
} MetaFields;

/* 0, or -1 when a TLV is truncated, or -2 with MemoryError set. */
static int
scan_meta(const unsigned char *meta, size_t n, MetaFields *f, Buf *headers)
{
    memset(f, 0, sizeof(*f));
    headers->len = 0;
    size_t i = 0, vlen, vstart;
    int tag, r;
    const unsigned char *value;
    while ((r = next_tlv(meta, n, &i, &tag, &value, &vlen, &vstart)) == 1) {
        if (tag >= 1 && tag <= TAG_SESSION_ORDINAL) {
            f->v[tag] = value;
            f->len[tag] = vlen;
        } else if (tag == TAG_HEADER) {
            if (buf_reserve(headers, i - vstart) < 0)
                return -2;
            memcpy(headers->p + headers->len, meta + vstart, i - vstart);
            headers->len += i - vstart;
        }
    }
    return r;
}

static int
valid_utf8(const unsigned char *s, size_t n, Py_ssize_t *chars)
{
    PyObject *u = PyUnicode_DecodeUTF8((const char *)s, (Py_ssize_t)n, "strict");
    if (u == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (chars)
        *chars = PyUnicode_GET_LENGTH(u);
    Py_DECREF(u);
    return 1;
}

/* valid_utf8 with the character count, ASCII (the usual partition key) without a decode. */
static int
key_chars(const unsigned char *s, size_t n, Py_ssize_t *chars)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] & 0x80)
            return valid_utf8(s, n, chars);
    *chars = (Py_ssize_t)n;
    return 1;
}

/* Checks a record's header TLVs as wire.validate_headers does; -1 with the error set.
 * `prefix_index` >= 0 prefixes the message with "record N: ". */
static int
validate_headers(const unsigned char *raw, size_t n, Py_ssize_t record)
{
    long long count = 0, total = 0;
    const unsigned char *names[64];
    size_t name_lens[64];
    size_t i = 0;
    while (i < n) {
        size_t length = ((size_t)raw[i + 1] << 8) | raw[i + 2];
        const unsigned char *value = raw + i + 3;
        i += 3 + length;
        if (count == RECORD_HEADERS_MAX) {
            raise_named(ErrInvalidRecordHeader, "record %zd: more than %lld headers", record, RECORD_HEADERS_MAX);
            return -1;
        }
        size_t name_len = length ? value[0] : 0;
        long long upper = RECORD_HEADER_NAME_BYTES_MAX < (long long)length - 1 ? RECORD_HEADER_NAME_BYTES_MAX
                                                                                : (long long)length - 1;
        if (!(name_len > 0 && (long long)name_len <= upper)) {
            raise_named(ErrInvalidRecordHeader, "record %zd: header %lld: name of %zu bytes in a header of %zu; "
                        "expected 1..%lld", record, count, name_len, length, RECORD_HEADER_NAME_BYTES_MAX);
            return -1;
        }
        int ok = valid_utf8(value + 1, name_len, NULL);
        if (ok < 0)
            return -1;
        if (!ok) {
            raise_named(ErrInvalidRecordHeader, "record %zd: header %lld: name is not UTF-8", record, count);
            return -1;
        }
        for (long long j = 0; j < count && j < 64; j++) {
            if (name_lens[j] == name_len && memcmp(names[j], value + 1, name_len) == 0) {
                raise_named(ErrInvalidRecordHeader, "record %zd: header %lld: name repeated", record, count);
                return -1;
            }
        }
        if (count < 64) {
            names[count] = value + 1;
            name_lens[count] = name_len;
        }
        count++;
        total += (long long)length - 1;
        if (total > RECORD_HEADERS_BYTES_MAX) {
            raise_named(ErrInvalidRecordHeader, "record %zd: headers of more than %lld bytes (names and values)",
                        record, RECORD_HEADERS_BYTES_MAX);
            return -1;
        }
    }
    return 0;
}

/* ---- encode_puts -------------------------------------------------------------------- */

static PyObject *
w_encode_puts(PyObject *self, PyObject *args)
{
    PyObject *records, *fallback;
    if (!PyArg_ParseTuple(args, "OO", &records, &fallback) || check_configured() < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(records, "records must be iterable");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *entries = PyList_New(n), *hashes = PyList_New(n);
    if (entries == NULL || hashes == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PySequence_Fast_GET_ITEM(seq, i);
        if (PyTuple_CheckExact(r) && PyTuple_GET_SIZE(r) == 2) {
            PyObject *key = PyTuple_GET_ITEM(r, 0), *data = PyTuple_GET_ITEM(r, 1);
            if (PyUnicode_CheckExact(key) && PyBytes_CheckExact(data)) {
                Py_ssize_t chars = PyUnicode_GET_LENGTH(key), data_len = PyBytes_GET_SIZE(data), key_len;
                if (chars >= PARTITION_KEY_CHARS_MIN && chars <= PARTITION_KEY_CHARS_MAX &&
                    data_len <= RECORD_DATA_BYTES_MAX) {
                    const char *kb = PyUnicode_AsUTF8AndSize(key, &key_len);
                    if (kb == NULL) {
                        PyErr_Clear();      /* lone surrogates: the fallback names the error */
                    } else {
                        PyObject *entry = PyBytes_FromStringAndSize(NULL, ENTRY_BYTES + key_len + data_len);
                        if (entry == NULL)
                            goto fail;
                        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(entry);
                        put_le32(p, (uint32_t)data_len);
                        put_le16(p + 4, (uint16_t)key_len);
                        put_le16(p + 6, 0);
                        memcpy(p + ENTRY_BYTES, kb, key_len);
                        memcpy(p + ENTRY_BYTES + key_len, PyBytes_AS_STRING(data), data_len);
                        PyList_SET_ITEM(entries, i, entry);
                        PyObject *h = hash_key_of((const unsigned char *)kb, key_len);
                        if (h == NULL)
                            goto fail;
                        PyList_SET_ITEM(hashes, i, h);
                        continue;
                    }
                }
            }
        }
        PyObject *pair = PyObject_CallOneArg(fallback, r);
        if (pair == NULL)
            goto fail;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_TypeError, "fallback must return (entry, hash key)");
            goto fail;
        }
        PyObject *entry = PyTuple_GET_ITEM(pair, 0), *h = PyTuple_GET_ITEM(pair, 1);
        Py_INCREF(entry);
        Py_INCREF(h);
        PyList_SET_ITEM(entries, i, entry);
        PyList_SET_ITEM(hashes, i, h);
        Py_DECREF(pair);
    }
    Py_DECREF(seq);
    PyObject *out = PyTuple_Pack(2, entries, hashes);
    Py_DECREF(entries);
    Py_DECREF(hashes);
    return out;
fail:
    Py_DECREF(seq);
    Py_XDECREF(entries);
    Py_XDECREF(hashes);
    return NULL;
}

/* ---- parse_put ---------------------------------------------------------------------- */

static PyObject *
new_tuple_of(PyObject *type, Py_ssize_t n)
{
    return ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
}

static PyObject *
w_parse_put(PyObject *self, PyObject *args)
{
    Py_ssize_t count;
    Py_buffer blob, pid;
    if (!PyArg_ParseTuple(args, "ny*y*", &count, &blob, &pid))
        return NULL;
    PyObject *out = NULL;
    Buf hdrs = {0};
    if (check_configured() < 0)
        goto done;
    const unsigned char *b = blob.buf;
    size_t n = (size_t)blob.len;
    int session = pid.len > 0;
    if (count < 1 || count > PUT_RECORDS_COUNT_MAX) {
        raise_named(ErrRequestTooLarge, "%zd records; expected 1..%lld", count, PUT_RECORDS_COUNT_MAX);
        goto done;
    }
    if (pid.len > PRODUCER_ID_BYTES_MAX) {
        raise_named(ErrInvalidArgument, "producer id of %zd bytes; at most %lld", pid.len, PRODUCER_ID_BYTES_MAX);
        goto done;
    }
    long long put_meta_max = 2 * 5 + 16 + 8 + 8 + 4 + DEDUP_KEY_BYTES_MAX;
    long long headers_meta_max = RECORD_HEADERS_BYTES_MAX + RECORD_HEADERS_MAX * 4;
    if ((long long)n > PUT_RECORDS_BYTES_MAX + count * (ENTRY_BYTES + put_meta_max + headers_meta_max)) {
        raise_named(ErrRequestTooLarge, "request of %zu bytes; at most %lld", n, PUT_RECORDS_BYTES_MAX);
        goto done;
    }
    out = PyList_New(count);
    if (out == NULL)
        goto done;
    size_t offset = 0;
    long long total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (offset + ENTRY_BYTES > n) {
            raise_named(ErrInvalidArgument, "record entries truncated");
            goto fail;
        }
        size_t data_len = le32(b + offset), key_len = le16(b + offset + 4), meta_len = le16(b + offset + 6);
        size_t k = offset + ENTRY_BYTES, m = k + key_len, d = m + meta_len;
        offset = d + data_len;
        if (offset > n) {
            raise_named(ErrInvalidArgument, "record entries truncated");
            goto fail;
        }
        if ((long long)data_len > RECORD_DATA_BYTES_MAX) {
            raise_named(ErrRecordTooLarge, "record %zd: %zu bytes of data; at most %lld", i, data_len,
                        RECORD_DATA_BYTES_MAX);
            goto fail;
        }
        Py_ssize_t chars = 0;
        int ok = key_chars(b + k, key_len, &chars);
        if (ok < 0)
            goto fail;
        if (!ok) {
            raise_named(ErrInvalidArgument, "record %zd: partition key is not UTF-8", i);
            goto fail;
        }
        if (chars < PARTITION_KEY_CHARS_MIN || chars > PARTITION_KEY_CHARS_MAX) {
            raise_named(ErrInvalidPartitionKey, "partition key of %zd chars; expected %lld..%lld", chars,
                        PARTITION_KEY_CHARS_MIN, PARTITION_KEY_CHARS_MAX);
            goto fail;
        }
        total += (long long)(data_len + key_len);
        MetaFields f;
        int r = scan_meta(b + m, meta_len, &f, &hdrs);
        if (r == -2)
            goto fail;
        if (r < 0) {
            raise_named(ErrInvalidArgument, "record meta truncated");
            goto fail;
        }
        const unsigned char *explicit = f.v[TAG_EXPLICIT_HASH_KEY], *sssn_v = f.v[TAG_SSSN],
                            *submit_v = f.v[TAG_SUBMIT_MS], *dedup_v = f.v[TAG_DEDUP_KEY],
                            *ord_v = f.v[TAG_SESSION_ORDINAL];
        size_t explicit_len = f.len[TAG_EXPLICIT_HASH_KEY], sssn_len = f.len[TAG_SSSN],
               submit_len = f.len[TAG_SUBMIT_MS], dedup_len = f.len[TAG_DEDUP_KEY], ord_len = f.len[TAG_SESSION_ORDINAL];
        PyObject *hash_key;
        if (explicit != NULL) {
            if (explicit_len != 16) {
                raise_named(ErrInvalidArgument, "record %zd: explicit hash key of %zu bytes; expected 16", i,
                            explicit_len);
                goto fail;
            }
            hash_key = NULL;   /* made below, once the record is valid */
        }
        uint64_t sssn = 0, submit_ms = 0;
        if (session) {
            if (sssn_v == NULL || submit_v == NULL) {
                raise_named(ErrInvalidArgument,
                            "record %zd: a producer session needs an SSSN and a submit time per record", i);
                goto fail;
            }
            if (sssn_len != 8) {
                raise_named(ErrInvalidArgument, "record %zd: SSSN of %zu bytes; expected 8", i, sssn_len);
                goto fail;
            }
            if (submit_len != 8) {
                raise_named(ErrInvalidArgument, "record %zd: submit time of %zu bytes; expected 8", i, submit_len);
                goto fail;
            }
            sssn = be64(sssn_v);
            submit_ms = be64(submit_v);
        } else if (dedup_v != NULL) {
            raise_named(ErrInvalidArgument, "record %zd: a dedup key needs a producer session (producer_id)", i);
            goto fail;
        }
        if (ord_v != NULL && (!session || ord_len != 4)) {
            raise_named(ErrInvalidArgument, "record %zd: a session partition is 4 bytes and needs a producer session",
                        i);
            goto fail;
        }
        if (hdrs.len) {
            if (validate_headers(hdrs.p, hdrs.len, i) < 0)
                goto fail;
            total += (long long)hdrs.len;
        }
        hash_key = explicit ? int_from_be128(explicit) : hash_key_of(b + k, key_len);
        PyObject *entry = new_tuple_of(PutEntryType, 9);
        if (entry == NULL || hash_key == NULL) {
            Py_XDECREF(hash_key);
            Py_XDECREF(entry);
            goto fail;
        }
        PyList_SET_ITEM(out, i, entry);
        PyTuple_SET_ITEM(entry, 0, hash_key);
        PyObject *items[8] = {
            PyBytes_FromStringAndSize((const char *)b + k, key_len),
            PyBytes_FromStringAndSize((const char *)b + d, data_len),
            PyLong_FromUnsignedLongLong(sssn),
            PyLong_FromUnsignedLongLong(submit_ms),
            dedup_v ? PyBytes_FromStringAndSize((const char *)dedup_v, dedup_len) : Py_NewRef(Py_None),
            ord_v ? PyLong_FromUnsignedLong(be32(ord_v)) : Py_NewRef(Py_None),
            PyBytes_FromStringAndSize((const char *)hdrs.p, hdrs.len),
            signature_of(b + k, key_len, b + d, data_len, hdrs.p, hdrs.len),
        };
        int bad = 0;
        for (int j = 0; j < 8; j++) {
            if (items[j] == NULL)
                bad = 1;
            PyTuple_SET_ITEM(entry, j + 1, items[j]);
        }
        if (bad)
            goto fail;
    }
    if (offset != n) {
        raise_named(ErrInvalidArgument, "%zd trailing bytes after %zd record entries", (Py_ssize_t)(n - offset),
                    count);
        goto fail;
    }
    if (total > PUT_RECORDS_BYTES_MAX) {
        raise_named(ErrRequestTooLarge, "request of %lld bytes of keys and data; at most %lld", total,
                    PUT_RECORDS_BYTES_MAX);
        goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(hdrs.p);
    PyBuffer_Release(&blob);
    PyBuffer_Release(&pid);
    return out;
}

/* ---- stored_entries ----------------------------------------------------------------- */

static PyObject *s_key, *s_data, *s_sssn, *s_dedup_key, *s_session_ordinal, *s_headers, *s_producer_id;

static int
bytes_attr(PyObject *obj, PyObject *name, PyObject **keep, const char **p, Py_ssize_t *len, int allow_none)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *keep = v;
    if (allow_none && v == Py_None) {
        *p = NULL;
        *len = -1;
        return 0;
    }
    if (!PyBytes_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%U of type %s; expected bytes", name, Py_TYPE(v)->tp_name);
        return -1;
    }
    *p = PyBytes_AS_STRING(v);
    *len = PyBytes_GET_SIZE(v);
    return 0;
}

static PyObject *
w_stored_entries(PyObject *self, PyObject *records)
{
    if (check_configured() < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(records, "records must be iterable"), *out = NULL;
    Buf buf = {0};
    if (seq == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *kk = NULL, *dk = NULL, *hk = NULL, *pk = NULL, *dedk = NULL, *sk = NULL, *ok = NULL;
        const char *key = NULL, *data = NULL, *headers = NULL, *pid = NULL, *dedup = NULL;
        Py_ssize_t key_len = 0, data_len = 0, headers_len = 0, pid_len = 0, dedup_len = -1;
        uint64_t sssn = 0;
        long ordinal = -1;
        int err = bytes_attr(s, s_key, &kk, &key, &key_len, 0) || bytes_attr(s, s_data, &dk, &data, &data_len, 0) ||
                  bytes_attr(s, s_headers, &hk, &headers, &headers_len, 0) ||
                  bytes_attr(s, s_producer_id, &pk, &pid, &pid_len, 0);
        const char *misfit = NULL;      /* the first field that does not fit, as wire._check_stored names it */
        if (!err && pid_len) {
            err = bytes_attr(s, s_dedup_key, &dedk, &dedup, &dedup_len, 1);
            if (!err) {
                sk = PyObject_GetAttr(s, s_sssn);
                ok = sk ? PyObject_GetAttr(s, s_session_ordinal) : NULL;
                if (ok == NULL)
                    err = 1;
                else {
                    int overflow = 0;
                    if (!PyLong_Check(sk) || (ok != Py_None && !PyLong_Check(ok))) {
                        PyErr_SetString(PyExc_TypeError, "sssn and session_ordinal must be int");
                        err = 1;
                    } else {
                        sssn = PyLong_AsUnsignedLongLong(sk);
                        if (sssn == (uint64_t)-1 && PyErr_Occurred()) {
                            PyErr_Clear();
                            overflow = 1;       /* negative or >= 2^64 */
                        }
                        if (ok != Py_None) {
                            unsigned long long o = PyLong_AsUnsignedLongLong(ok);
                            if ((o == (unsigned long long)-1 && PyErr_Occurred()) || o > 0xFFFFFFFFULL) {
                                PyErr_Clear();
                                overflow |= 2;
                            } else
                                ordinal = (long)o;
                        }
                        size_t meta_all = (size_t)headers_len + 2 + pid_len + 10 + (dedup ? 2 + dedup_len : 0) +
                                          (ok != Py_None ? 6 : 0);
                        misfit = key_len > 0xFFFF ? "key" : (unsigned long long)data_len > 0xFFFFFFFFULL ? "data"
                               : pid_len > 0xFF ? "producer id" : (dedup && dedup_len > 0xFF) ? "dedup key"
                               : (overflow & 1) ? "sssn" : (overflow & 2) ? "session ordinal"
                               : meta_all > 0xFFFF ? "meta" : NULL;
                    }
                }
            }
        } else if (!err) {
            misfit = key_len > 0xFFFF ? "key" : (unsigned long long)data_len > 0xFFFFFFFFULL ? "data"
                   : headers_len > 0xFFFF ? "meta" : NULL;
        }
        if (!err && misfit != NULL) {
            raise_named(ErrInvalidArgument, "record %zd: its %s does not fit its stored field", i, misfit);
            err = 1;
        }
        if (!err) {
            size_t meta = (size_t)headers_len;
            if (pid_len)
                meta += 2 + pid_len + 10 + (dedup ? 2 + dedup_len : 0) + (ordinal >= 0 ? 6 : 0);
            err = buf_reserve(&buf, ENTRY_BYTES + key_len + meta + data_len) < 0;
            if (!err) {
                unsigned char *p = buf.p + buf.len;
                put_le32(p, (uint32_t)data_len);
                put_le16(p + 4, (uint16_t)key_len);
                put_le16(p + 6, (uint16_t)meta);
                p += ENTRY_BYTES;
                memcpy(p, key, key_len);
                p += key_len;
                if (pid_len) {
                    *p++ = TAG_PRODUCER_ID;
                    *p++ = (unsigned char)pid_len;
                    memcpy(p, pid, pid_len);
                    p += pid_len;
                    *p++ = TAG_SSSN;
                    *p++ = 8;
                    put_be64(p, sssn);
                    p += 8;
                    if (dedup) {
                        *p++ = TAG_DEDUP_KEY;
                        *p++ = (unsigned char)dedup_len;
                        memcpy(p, dedup, dedup_len);
                        p += dedup_len;
                    }
                    if (ordinal >= 0) {
                        *p++ = TAG_SESSION_ORDINAL;
                        *p++ = 4;
                        put_be32(p, (uint32_t)ordinal);
                        p += 4;
                    }
                }
                memcpy(p, headers, headers_len);
                p += headers_len;
                memcpy(p, data, data_len);
                p += data_len;
                buf.len = (size_t)(p - buf.p);
            }
        }
        Py_XDECREF(kk); Py_XDECREF(dk); Py_XDECREF(hk); Py_XDECREF(pk); Py_XDECREF(dedk); Py_XDECREF(sk);
        Py_XDECREF(ok);
        if (err)
            goto done;
    }
    out = PyBytes_FromStringAndSize((const char *)buf.p, buf.len);
done:
    Py_XDECREF(seq);
    PyMem_Free(buf.p);
    return out;
}

/* ---- check_framing ------------------------------------------------------------------ */

/* Walks `count` entries from `offset`; returns the end offset (may be > n: overran). */
static size_t
walk(const unsigned char *b, size_t n, size_t offset, Py_ssize_t count, int *short_header)
{
    *short_header = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (offset + ENTRY_BYTES > n) {
            *short_header = 1;
            return n + 1;
        }
        offset += ENTRY_BYTES + (size_t)le16(b + offset + 4) + le16(b + offset + 6) + le32(b + offset);
    }
    return offset;
}

static PyObject *
w_check_framing(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t count, offset = 0;
    if (!PyArg_ParseTuple(args, "y*n|n", &buf, &count, &offset))
        return NULL;
    if (check_configured() < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    size_t n = (size_t)buf.len;
    if (offset < 0 || (size_t)offset > n) {
        PyBuffer_Release(&buf);
        return raise_named(ErrInvalidArgument, "offset %zd; expected 0..%zu", offset, n);
    }
    int short_header;
    size_t end = walk(buf.buf, n, (size_t)offset, count, &short_header);
    PyBuffer_Release(&buf);
    if (end > n)
        return raise_named(ErrInvalidArgument, "record entries truncated");
    if (end != n)
        return raise_named(ErrInvalidArgument, "%zd trailing bytes after %zd record entries", (Py_ssize_t)(n - end),
                           count);
    Py_RETURN_NONE;
}

/* ---- reads: decode_records and session_fields --------------------------------------- */

typedef struct {
    PyObject *header;       /* BatchHeader from wire.verify */
    PyObject *first_sn;
    Py_ssize_t count;
} Verified;

static int
verified(PyObject *batch, Verified *v)
{
    v->header = PyObject_CallOneArg(VerifyFn, batch);
    if (v->header == NULL)
        return -1;
    PyObject *count = PyObject_GetAttrString(v->header, "count");
    v->first_sn = PyObject_GetAttrString(v->header, "first_sn");
    if (count == NULL || v->first_sn == NULL) {
        Py_XDECREF(count);
        return -1;
    }
    v->count = PyLong_AsSsize_t(count);
    Py_DECREF(count);
    return 0;
}

static void
verified_release(Verified *v)
{
    Py_XDECREF(v->header);
    Py_XDECREF(v->first_sn);
}

static PyObject *
corrupt(Verified *v, const char *what)
{
    if (v->first_sn == NULL)
        return raise_named(ErrCorruptBatch, "batch: %s", what);
    return raise_named(ErrCorruptBatch, "batch first_sn %S: %s", v->first_sn, what);
}

/* One entry of a batch at *offset: its key, meta and data offsets and lengths, *offset
 * moved past it; -1 when it runs past the n bytes of the batch. */
typedef struct {
    size_t k, m, d, key_len, meta_len, data_len;
} Entry;

static inline int
next_entry(const unsigned char *b, size_t n, size_t *offset, Entry *e)
{
    if (*offset + ENTRY_BYTES > n)
        return -1;
    e->data_len = le32(b + *offset);
    e->key_len = le16(b + *offset + 4);
    e->meta_len = le16(b + *offset + 6);
    e->k = *offset + ENTRY_BYTES;
    e->m = e->k + e->key_len;
    e->d = e->m + e->meta_len;
    *offset = e->d + e->data_len;
    return *offset > n ? -1 : 0;
}

/* The prelude of the readers of a stored batch: (batch bytes, start, end), the batch
 * verified, end clamped to its count and start to [0, end]. -1 with the error set. */
static int
begin_read(PyObject *args, const char *fmt, PyObject **batch_obj, Py_ssize_t *start, Py_ssize_t *end,
           PyObject **extra, Verified *v)
{
    int ok = extra ? PyArg_ParseTuple(args, fmt, batch_obj, start, end, extra)
                   : PyArg_ParseTuple(args, fmt, batch_obj, start, end);
    if (!ok || check_configured() < 0)
        return -1;
    if (!PyBytes_Check(*batch_obj)) {
        PyErr_SetString(PyExc_TypeError, "a stored batch must be bytes");
        return -1;
    }
    if (verified(*batch_obj, v) < 0)
        return -1;
    if (*end > v->count)
        *end = v->count;
    if (*start < 0)
        *start = 0;
    if (*start > *end)
        *start = *end;
    return 0;
}

/* SN of record i: first_sn + i * 2^32 (first_sn from the batch header, big-endian 128). */
static PyObject *
sn_at(const unsigned char *raw_first, Py_ssize_t i)
{
    unsigned char sn[16];
    uint64_t hi = be64(raw_first), lo = be64(raw_first + 8);
    uint64_t add = (uint64_t)i << 32;
    uint64_t nlo = lo + add;
    hi += (nlo < lo) + ((uint64_t)i >> 32);
    put_be64(sn, hi);
    put_be64(sn + 8, nlo);
    return int_from_be128(sn);
}

static PyObject *
w_decode_records(PyObject *self, PyObject *args)
{
    PyObject *batch_obj, *ordinal = NULL, *out = NULL;
    Py_ssize_t start, end;
    Verified v = {0};
    if (begin_read(args, "OnnO", &batch_obj, &start, &end, &ordinal, &v) < 0)
        goto done;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(batch_obj);
    size_t n = (size_t)PyBytes_GET_SIZE(batch_obj);
    size_t offset = HEADER_BYTES;
    for (Py_ssize_t i = 0; i < start; i++) {
        if (offset + ENTRY_BYTES > n) {
            corrupt(&v, "entries run past the batch");
            goto done;
        }
        offset += ENTRY_BYTES + (size_t)le16(b + offset + 4) + le16(b + offset + 6) + le32(b + offset);
        if (offset > n) {
            corrupt(&v, "entries run past the batch");
            goto done;
        }
    }
    int untrack = PyLong_CheckExact(ordinal);
    out = PyList_New(end - start);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = start; i < end; i++) {
        Entry e;
        if (next_entry(b, n, &offset, &e) < 0) {
            corrupt(&v, "entries run past the batch");
            goto fail;
        }
        size_t data_len = e.data_len, key_len = e.key_len, meta_len = e.meta_len, k = e.k, m = e.m, d = e.d;
        PyObject *key = PyUnicode_DecodeUTF8((const char *)b + k, (Py_ssize_t)key_len, "strict");
        if (key == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                PyErr_NormalizeException(&type, &value, &tb);
                raise_named(ErrCorruptBatch, "batch first_sn %S: %S", v.first_sn, value);
                Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
            }
            goto fail;
        }
        PyObject *rec = new_tuple_of(RecordType, 5);
        if (rec == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        PyList_SET_ITEM(out, i - start, rec);
        PyTuple_SET_ITEM(rec, 0, key);
        PyObject *data = PyBytes_FromStringAndSize((const char *)b + d, data_len);
        PyObject *sn = sn_at(b + 8, i);
        PyObject *meta = PyBytes_FromStringAndSize((const char *)b + m, meta_len);
        Py_INCREF(ordinal);
        PyTuple_SET_ITEM(rec, 1, data);
        PyTuple_SET_ITEM(rec, 2, sn);
        PyTuple_SET_ITEM(rec, 3, ordinal);
        PyTuple_SET_ITEM(rec, 4, meta);
        if (data == NULL || sn == NULL || meta == NULL)
            goto fail;
        if (untrack)
            PyObject_GC_UnTrack(rec);    /* str, bytes and ints only: never in a cycle, nothing for the
                                            collector to visit (CPython untracks such plain tuples itself) */
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    verified_release(&v);
    return out;
}

static PyObject *
w_session_fields(PyObject *self, PyObject *args)
{
    PyObject *batch_obj, *out = NULL;
    Py_ssize_t start, end;
    Verified v = {0};
    Buf hdrs = {0};
    if (begin_read(args, "Onn", &batch_obj, &start, &end, NULL, &v) < 0)
        goto done;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(batch_obj);
    size_t n = (size_t)PyBytes_GET_SIZE(batch_obj);
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    size_t offset = HEADER_BYTES;
    for (Py_ssize_t i = 0; i < v.count; i++) {
        Entry e;
        if (next_entry(b, n, &offset, &e) < 0) {
            corrupt(&v, "record entries truncated");
            goto fail;
        }
        size_t data_len = e.data_len, key_len = e.key_len, meta_len = e.meta_len, k = e.k, m = e.m, d = e.d;
        if (i < start || i >= end || meta_len == 0)
            continue;
        MetaFields mf;
        int r = scan_meta(b + m, meta_len, &mf, &hdrs);
        if (r == -2)
            goto fail;
        if (r < 0) {
            corrupt(&v, "record meta truncated");
            goto fail;
        }
        const unsigned char *pid = mf.v[TAG_PRODUCER_ID], *sssn_v = mf.v[TAG_SSSN], *dedup_v = mf.v[TAG_DEDUP_KEY],
                            *ord_v = mf.v[TAG_SESSION_ORDINAL];
        size_t pid_len = mf.len[TAG_PRODUCER_ID], sssn_len = mf.len[TAG_SSSN], dedup_len = mf.len[TAG_DEDUP_KEY],
               ord_len = mf.len[TAG_SESSION_ORDINAL];
        if (pid == NULL || sssn_v == NULL || sssn_len != 8)
            continue;
        PyObject *f = new_tuple_of(SessionFieldsType, 6);
        if (f == NULL)
            goto fail;
        int bad = PyList_Append(out, f) < 0;
        Py_DECREF(f);
        PyObject *items[6] = {
            PyLong_FromSsize_t(i),
            PyBytes_FromStringAndSize((const char *)pid, pid_len),
            PyLong_FromUnsignedLongLong(be64(sssn_v)),
            dedup_v ? PyBytes_FromStringAndSize((const char *)dedup_v, dedup_len) : Py_NewRef(Py_None),
            (ord_v && ord_len == 4) ? PyLong_FromUnsignedLong(be32(ord_v)) : Py_NewRef(Py_None),
            signature_of(b + k, key_len, b + d, data_len, hdrs.p, hdrs.len),
        };
        for (int j = 0; j < 6; j++) {
            if (items[j] == NULL)
                bad = 1;
            PyTuple_SET_ITEM(f, j, items[j]);
        }
        if (bad)
            goto fail;
    }
    if (offset != n) {
        PyObject *msg = PyUnicode_FromFormat("%zd trailing bytes after %zd record entries", (Py_ssize_t)(n - offset),
                                             v.count);
        if (msg != NULL) {
            raise_named(ErrCorruptBatch, "batch first_sn %S: %U", v.first_sn, msg);
            Py_DECREF(msg);
        }
        goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(hdrs.p);
    verified_release(&v);
    return out;
}

/* ---- columns: a stored batch's records as Arrow-shaped buffers --------------------------- */

/* An SN as three base-10^19 digits, top first: the batch's first SN is split once (two
 * 128-bit divisions), and record i's SN (first + i * 2^32) is then a 64-bit add with
 * carries: no division per record. */
typedef struct {
    uint64_t top, mid, low;     /* top < 35, mid and low < 10^19 */
} Dec3;

#define E19 10000000000000000000ULL

static Dec3
dec3_of(uint64_t hi, uint64_t lo)
{
    unsigned __int128 v = ((unsigned __int128)hi << 64) | lo;
    Dec3 d;
    d.low = (uint64_t)(v % E19);
    v /= E19;
    d.mid = (uint64_t)(v % E19);
    d.top = (uint64_t)(v / E19);
    return d;
}

/* d + add (add < 2^64) */
static inline Dec3
dec3_add(Dec3 d, uint64_t add)
{
    unsigned __int128 low = (unsigned __int128)d.low + add;    /* < 10^19 + 2^64 < 3 * 10^19 */
    uint64_t carry = 0;
    while (low >= E19) {
        low -= E19;
        carry++;
    }
    d.low = (uint64_t)low;
    d.mid += carry;
    if (d.mid >= E19) {
        d.mid -= E19;
        d.top += 1;
    }
    return d;
}

static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* x as exactly 19 decimal digits (zero-padded) at out */
static inline void
u64_19(uint64_t x, char *out)
{
    for (int p = 17; p >= 1; p -= 2) {
        unsigned r = (unsigned)(x % 100);
        x /= 100;
        out[p] = DIGIT_PAIRS[2 * r];
        out[p + 1] = DIGIT_PAIRS[2 * r + 1];
    }
    out[0] = (char)('0' + (int)x);
}

/* d as decimal text without leading zeros into out (>= 60 bytes); returns its length */
static inline size_t
dec3_text(Dec3 d, char *out)
{
    char tmp[57];
    u64_19(d.top, tmp);          /* (top < 35: its 19 digits are mostly zeros) */
    u64_19(d.mid, tmp + 19);
    u64_19(d.low, tmp + 38);
    size_t z = 0;
    while (z < 56 && tmp[z] == '0')
        z++;
    memcpy(out, tmp + z, 57 - z);
    return 57 - z;
}

enum { KO, KV, DO, DV, SO, SV, TS, HO, HKO, HKV, HVO, HVV, NCOL };
#define SN_TEXT_MAX 39            /* decimal digits of an SN (< 2^128) */

/* A column being measured (p == NULL: only len counts) or filled (p: cap bytes, exactly
 * what the measuring pass counted; more would be a bug, refused, never a write past it). */
static inline int
cput(Buf *b, const void *p, size_t n)
{
    if (b->p != NULL) {
        if (b->len + n > b->cap) {
            PyErr_SetString(PyExc_SystemError, "sms._wire.columns: a column outgrew its measured size");
            return -1;
        }
        if (n)
            memcpy(b->p + b->len, p, n);
    }
    b->len += n;
    return 0;
}

static inline int
coffset(Buf *offsets, size_t value)
{
    unsigned char raw[4];
    put_le32(raw, (uint32_t)value);
    return cput(offsets, raw, 4);
}

/* Records [start, end) of one verified stored batch appended to the columns c (measured,
 * or filled: see cput); offsets go on from what c already holds, so a page of many
 * batches is one set of columns. -1 with the error set. */
static int
columns_append(Buf *c, const unsigned char *b, size_t n, Py_ssize_t start, Py_ssize_t end, size_t *headers_total,
               Verified *v)
{
    int measure = c[KV].p == NULL;
    size_t offset = HEADER_BYTES;
    uint64_t first_hi = be64(b + 8), first_lo = be64(b + 16);
    Dec3 first_dec = dec3_of(first_hi, first_lo);
    for (Py_ssize_t i = 0; i < end; i++) {
        Entry e;
        if (next_entry(b, n, &offset, &e) < 0) {
            corrupt(v, "entries run past the batch");
            return -1;
        }
        size_t data_len = e.data_len, key_len = e.key_len, meta_len = e.meta_len, k = e.k, m = e.m, d = e.d;
        if (i < start)
            continue;
        if (measure) {
            Py_ssize_t chars;
            int ok = key_chars(b + k, key_len, &chars);
            if (ok < 0)
                return -1;
            if (!ok) {
                corrupt(v, "a partition key is not UTF-8");
                return -1;
            }
        }
        uint64_t add = (uint64_t)i << 32, lo = first_lo + add, hi = first_hi + (lo < first_lo);
        char text[64];
        size_t tl = measure ? SN_TEXT_MAX : dec3_text(dec3_add(first_dec, add), text);
        unsigned char ts[8];
        uint64_t ms = hi >> 16;              /* the SN's top 48 bits: milliseconds */
        for (int j = 0; j < 8; j++)
            ts[j] = (unsigned char)(ms >> (8 * j));
        if (cput(&c[KV], b + k, key_len) || coffset(&c[KO], c[KV].len) ||
            cput(&c[DV], b + d, data_len) || coffset(&c[DO], c[DV].len) ||
            cput(&c[SV], text, tl) || coffset(&c[SO], c[SV].len) || cput(&c[TS], ts, 8))
            return -1;
        if (meta_len) {
            size_t mi = 0, vlen, vstart;
            int tag, r;
            const unsigned char *value;
            while ((r = next_tlv(b + m, meta_len, &mi, &tag, &value, &vlen, &vstart)) == 1) {
                if (tag != TAG_HEADER || vlen == 0 || (size_t)value[0] + 1 > vlen)
                    continue;
                size_t name_len = value[0];
                if (cput(&c[HKV], value + 1, name_len) || coffset(&c[HKO], c[HKV].len) ||
                    cput(&c[HVV], value + 1 + name_len, vlen - 1 - name_len) || coffset(&c[HVO], c[HVV].len))
                    return -1;
                (*headers_total)++;
            }
            if (r < 0) {
                corrupt(v, "record meta truncated");
                return -1;
            }
        }
        if (coffset(&c[HO], *headers_total))
            return -1;
    }
    return 0;
}

/* (count, then the NCOL buffers) of a page: `slices` is a sequence of (batch bytes, start,
 * end), each batch verified, its end clamped to its count and its start to [0, end]. The
 * concatenation of each slice's columns, offsets running on: one set of Arrow buffers.
 * Two passes: the first verifies and measures every column, the second writes each
 * straight into its bytes object of that size (no growing buffer, no copy at the end:
 * a page of a megabyte was mostly page faults of the growing and the copying). */
static PyObject *
columns_of(PyObject *slices)
{
    PyObject *seq = NULL, *out = NULL, *cols[NCOL] = {NULL};
    Buf c[NCOL];
    memset(c, 0, sizeof(c));
    Py_ssize_t *bounds = NULL, count = 0;
    if (check_configured() < 0)
        return NULL;
    seq = PySequence_Fast(slices, "slices must be a sequence of (batch, start, end)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    bounds = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(ns ? ns : 1));
    if (bounds == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int pass = 0; pass < 2; pass++) {
        size_t headers_total = 0;
        if (coffset(&c[KO], 0) || coffset(&c[DO], 0) || coffset(&c[SO], 0) || coffset(&c[HO], 0) ||
            coffset(&c[HKO], 0) || coffset(&c[HVO], 0))
            goto done;
        for (Py_ssize_t s = 0; s < ns; s++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, s), *batch_obj;
            Py_ssize_t start, end;
            Verified v = {0};
            if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "Onn", &batch_obj, &start, &end)) {
                if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    PyErr_SetString(PyExc_TypeError, "each slice must be a tuple (batch bytes, start, end)");
                }
                goto done;
            }
            if (!PyBytes_Check(batch_obj)) {
                PyErr_SetString(PyExc_TypeError, "a stored batch must be bytes");
                goto done;
            }
            if (pass == 0) {
                if (verified(batch_obj, &v) < 0) {
                    verified_release(&v);
                    goto done;
                }
                if (end > v.count)
                    end = v.count;
                if (start < 0)
                    start = 0;
                if (start > end)
                    start = end;
                bounds[2 * s] = start;
                bounds[2 * s + 1] = end;
                count += end - start;
            } else {
                start = bounds[2 * s];
                end = bounds[2 * s + 1];
            }
            int r = columns_append(c, (const unsigned char *)PyBytes_AS_STRING(batch_obj),
                                   (size_t)PyBytes_GET_SIZE(batch_obj), start, end, &headers_total, &v);
            verified_release(&v);
            if (r < 0)
                goto done;
        }
        if (pass == 0) {
            for (int j = 0; j < NCOL; j++) {
                cols[j] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)c[j].len);
                if (cols[j] == NULL)
                    goto done;
                c[j].p = (unsigned char *)PyBytes_AS_STRING(cols[j]);
                c[j].cap = c[j].len;
                c[j].len = 0;
            }
        }
    }
    for (int j = 0; j < NCOL; j++) {
        if (c[j].len != c[j].cap) {      /* (the SNs: measured at their longest) */
            if (j != SV) {
                PyErr_SetString(PyExc_SystemError, "sms._wire.columns: a column came out short of its measure");
                goto done;
            }
            if (_PyBytes_Resize(&cols[j], (Py_ssize_t)c[j].len) < 0)
                goto done;
        }
    }
    out = PyTuple_New(NCOL + 1);
    if (out == NULL)
        goto done;
    PyTuple_SET_ITEM(out, 0, PyLong_FromSsize_t(count));
    for (int j = 0; j < NCOL; j++) {
        PyTuple_SET_ITEM(out, j + 1, cols[j]);
        cols[j] = NULL;
    }
done:
    for (int j = 0; j < NCOL; j++)
        Py_XDECREF(cols[j]);
    PyMem_Free(bounds);
    Py_XDECREF(seq);
    return out;
}

static PyObject *
w_columns(PyObject *self, PyObject *args)
{
    PyObject *batch_obj;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "Onn", &batch_obj, &start, &end))
        return NULL;
    PyObject *one = Py_BuildValue("((Onn))", batch_obj, start, end);
    if (one == NULL)
        return NULL;
    PyObject *out = columns_of(one);
    Py_DECREF(one);
    return out;
}

static PyObject *
w_columns_many(PyObject *self, PyObject *slices)
{
    return columns_of(slices);
}

/* ---- check_records: every record of a batch body as a reader decodes it ------------------ */

/* UTF-8 as Python's strict decoder takes it (no overlong forms, no surrogates, nothing
 * past U+10FFFF): 1 with the number of characters, 0 when it is not UTF-8. No Python
 * object: the head runs this on every key of every batch. */
static int
utf8_chars(const unsigned char *s, size_t n, size_t *chars)
{
    size_t i = 0, c = 0;
    while (i < n) {
        unsigned char lead = s[i];
        if (lead < 0x80) {
            i++;
            c++;
            continue;
        }
        size_t more;
        unsigned char lo = 0x80, hi = 0xBF;         /* the bounds of the second byte */
        if (lead >= 0xC2 && lead <= 0xDF)
            more = 1;
        else if (lead == 0xE0) {
            more = 2;
            lo = 0xA0;                              /* (below: an overlong form) */
        } else if (lead == 0xED) {
            more = 2;
            hi = 0x9F;                              /* (above: a surrogate) */
        } else if (lead >= 0xE1 && lead <= 0xEF)
            more = 2;
        else if (lead == 0xF0) {
            more = 3;
            lo = 0x90;
        } else if (lead >= 0xF1 && lead <= 0xF3)
            more = 3;
        else if (lead == 0xF4) {
            more = 3;
            hi = 0x8F;                              /* (above: past U+10FFFF) */
        } else
            return 0;
        if (n - i <= more || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += more + 1;
        c++;
    }
    *chars = c;
    return 1;
}

/* A stored record's meta as wire._check_stored_meta checks it: TLVs that frame, the
 * session fields of the right sizes and only together with a producer id and an SSSN,
 * headers as validate_headers wants them. -1 with the named error set. */
static int
check_stored_meta(const unsigned char *meta, size_t n, Py_ssize_t record, Buf *hdrs)
{
    size_t i = 0, vlen, vstart;
    int tag, r, has_pid = 0, has_sssn = 0, has_other = 0;
    const unsigned char *value;
    hdrs->len = 0;
    while ((r = next_tlv(meta, n, &i, &tag, &value, &vlen, &vstart)) == 1) {
        switch (tag) {
        case TAG_PRODUCER_ID:
            if (vlen < 1 || (long long)vlen > SESSION_KEY_BYTES_MAX) {
                raise_named(ErrInvalidArgument, "record %zd: producer id of %zu bytes; expected 1..%lld", record,
                            vlen, SESSION_KEY_BYTES_MAX);
                return -1;
            }
            has_pid = 1;
            break;
        case TAG_SSSN:
            if (vlen != 8) {
                raise_named(ErrInvalidArgument, "record %zd: SSSN of %zu bytes; expected 8", record, vlen);
                return -1;
            }
            has_sssn = 1;
            break;
        case TAG_DEDUP_KEY:         /* (its length unchecked: see wire._check_stored_meta) */
            has_other = 1;
            break;
        case TAG_SESSION_ORDINAL:
            if (vlen != 4) {
                raise_named(ErrInvalidArgument, "record %zd: session partition of %zu bytes; expected 4", record,
                            vlen);
                return -1;
            }
            has_other = 1;
            break;
        case TAG_HEADER:
            if (buf_reserve(hdrs, i - vstart) < 0)
                return -1;
            memcpy(hdrs->p + hdrs->len, meta + vstart, i - vstart);
            hdrs->len += i - vstart;
            break;
        default:
            break;                  /* a tag no reader knows: every reader skips it */
        }
    }
    if (r < 0) {
        raise_named(ErrInvalidArgument, "record %zd: meta truncated", record);
        return -1;
    }
    if ((has_pid || has_sssn || has_other) && !(has_pid && has_sssn)) {
        raise_named(ErrInvalidArgument, "record %zd: session fields without a producer id and an SSSN", record);
        return -1;
    }
    if (hdrs->len && validate_headers(hdrs->p, hdrs->len, record) < 0)
        return -1;
    return 0;
}

static PyObject *
w_check_records(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t count, offset = 0;
    if (!PyArg_ParseTuple(args, "y*n|n", &buf, &count, &offset))
        return NULL;
    PyObject *out = NULL;
    Buf hdrs = {0};
    if (check_configured() < 0)
        goto done;
    const unsigned char *b = buf.buf;
    size_t n = (size_t)buf.len;
    if (offset < 0 || (size_t)offset > n) {
        raise_named(ErrInvalidArgument, "offset %zd; expected 0..%zu", offset, n);
        goto done;
    }
    size_t at = (size_t)offset;
    for (Py_ssize_t i = 0; i < count; i++) {
        Entry e;
        if (next_entry(b, n, &at, &e) < 0) {
            raise_named(ErrInvalidArgument, "record entries truncated");
            goto done;
        }
        if ((long long)e.data_len > RECORD_DATA_BYTES_MAX) {
            raise_named(ErrRecordTooLarge, "record %zd: %zu bytes of data; at most %lld", i, e.data_len,
                        RECORD_DATA_BYTES_MAX);
            goto done;
        }
        size_t chars;
        if (!utf8_chars(b + e.k, e.key_len, &chars)) {
            raise_named(ErrInvalidPartitionKey, "record %zd: partition key is not UTF-8", i);
            goto done;
        }
        if ((long long)chars < PARTITION_KEY_CHARS_MIN || (long long)chars > PARTITION_KEY_CHARS_MAX) {
            raise_named(ErrInvalidPartitionKey, "record %zd: partition key of %zu chars; expected %lld..%lld", i,
                        chars, PARTITION_KEY_CHARS_MIN, PARTITION_KEY_CHARS_MAX);
            goto done;
        }
        if (e.meta_len && check_stored_meta(b + e.m, e.meta_len, i, &hdrs) < 0)
            goto done;
    }
    if (at != n) {
        raise_named(ErrInvalidArgument, "%zd trailing bytes after %zd record entries", (Py_ssize_t)(n - at), count);
        goto done;
    }
    out = Py_NewRef(Py_None);
done:
    PyMem_Free(hdrs.p);
    PyBuffer_Release(&buf);
    return out;
}

/* ---- the producer's side of PutRecords ------------------------------------------------ */

static PyObject *s_extra;

/* A bytes attribute of a record; NULL with TypeError when it is not bytes. */
static PyObject *
record_bytes(PyObject *record, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(record, name);
    if (v != NULL && !PyBytes_Check(v)) {
        PyErr_Format(PyExc_TypeError, "record field %S must be bytes, not %s", name, Py_TYPE(v)->tp_name);
        Py_CLEAR(v);
    }
    return v;
}

/* encode_session_entries(records, submit_ms): per record (key, data, sssn, extra
 * attributes), ENTRY (<IHH: data, key, meta lengths) + key + meta + data, the meta being
 * the SSSN and submit-time TLVs (>BBQBBQ) and then `extra`. */
static PyObject *
w_encode_session_entries(PyObject *self, PyObject *args)
{
    PyObject *records, *seq = NULL, *out = NULL;
    unsigned long long submit_ms;
    if (!PyArg_ParseTuple(args, "OK", &records, &submit_ms))
        return NULL;
    seq = PySequence_Fast(records, "records must be iterable");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *key = record_bytes(r, s_key), *data = key ? record_bytes(r, s_data) : NULL;
        PyObject *extra = data ? record_bytes(r, s_extra) : NULL, *sssn_obj = extra ? PyObject_GetAttr(r, s_sssn) : NULL;
        unsigned long long sssn = 0;
        if (sssn_obj != NULL) {
            sssn = PyLong_AsUnsignedLongLong(sssn_obj);
            if (sssn == (unsigned long long)-1 && PyErr_Occurred())
                Py_CLEAR(sssn_obj);
        }
        if (sssn_obj == NULL) {
            Py_XDECREF(key); Py_XDECREF(data); Py_XDECREF(extra);
            Py_CLEAR(out);
            goto done;
        }
        Py_ssize_t kl = PyBytes_GET_SIZE(key), dl = PyBytes_GET_SIZE(data), el = PyBytes_GET_SIZE(extra);
        Py_ssize_t ml = 20 + el;
        if (kl > 0xFFFF || ml > 0xFFFF || (unsigned long long)dl > 0xFFFFFFFFULL) {
            PyErr_Format(PyExc_OverflowError, "record %zd: key of %zd, meta of %zd or data of %zd bytes does "
                         "not fit an entry", i, kl, ml, dl);
            Py_DECREF(key); Py_DECREF(data); Py_DECREF(extra); Py_DECREF(sssn_obj);
            Py_CLEAR(out);
            goto done;
        }
        PyObject *entry = PyBytes_FromStringAndSize(NULL, 8 + kl + ml + dl);
        if (entry != NULL) {
            unsigned char *p = (unsigned char *)PyBytes_AS_STRING(entry);
            put_le32(p, (uint32_t)dl);
            put_le16(p + 4, (uint16_t)kl);
            put_le16(p + 6, (uint16_t)ml);
            p += 8;
            memcpy(p, PyBytes_AS_STRING(key), (size_t)kl);
            p += kl;
            p[0] = TAG_SSSN; p[1] = 8; put_be64(p + 2, (uint64_t)sssn);
            p[10] = TAG_SUBMIT_MS; p[11] = 8; put_be64(p + 12, (uint64_t)submit_ms);
            p += 20;
            memcpy(p, PyBytes_AS_STRING(extra), (size_t)el);
            p += el;
            memcpy(p, PyBytes_AS_STRING(data), (size_t)dl);
        }
        Py_DECREF(key); Py_DECREF(data); Py_DECREF(extra); Py_DECREF(sssn_obj);
        if (entry == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, entry);
    }
done:
    Py_XDECREF(seq);
    return out;
}

/* decode_put_results(sequence_numbers, ordinals, count): (SNs, partition ordinals). */
static PyObject *
w_decode_put_results(PyObject *self, PyObject *args)
{
    Py_buffer sns, ords;
    Py_ssize_t count;
    PyObject *out = NULL, *a = NULL, *b = NULL;
    if (!PyArg_ParseTuple(args, "y*y*n", &sns, &ords, &count))
        return NULL;
    if (check_configured() < 0)
        goto done;
    if (count < 0 || sns.len != 16 * count || ords.len != 4 * count) {
        raise_named(ErrInvalidArgument, "PutRecords answer of %zd SN bytes and %zd ordinal bytes for %zd records",
                    sns.len, ords.len, count);
        goto done;
    }
    a = PyList_New(count);
    b = a ? PyList_New(count) : NULL;
    if (b == NULL)
        goto done;
    const unsigned char *sp = sns.buf, *op = ords.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *sn = int_from_be128(sp + 16 * i), *ordinal = sn ? PyLong_FromUnsignedLong(le32(op + 4 * i)) : NULL;
        if (ordinal == NULL) {
            Py_XDECREF(sn);
            goto done;
        }
        PyList_SET_ITEM(a, i, sn);
        PyList_SET_ITEM(b, i, ordinal);
    }
    out = PyTuple_Pack(2, a, b);
done:
    Py_XDECREF(a);
    Py_XDECREF(b);
    PyBuffer_Release(&sns);
    PyBuffer_Release(&ords);
    return out;
}

/* ---- put_runs: a request in the producer's usual form, as runs of columns ---------- */

static int
append_run(PyObject *out, uint32_t ordinal, Py_ssize_t start, Py_ssize_t end, uint64_t first_sssn,
           uint64_t submit_min, uint64_t submit_max, const unsigned char *hash_min, const unsigned char *hash_max,
           const unsigned char *sigs, const unsigned char *submits, const unsigned char *stored, size_t stored_len,
           long long size)
{
    Py_ssize_t count = end - start;
    PyObject *run = PyTuple_New(12);
    if (run == NULL)
        return -1;
    PyObject *items[12] = {
        PyLong_FromUnsignedLong(ordinal),
        PyLong_FromSsize_t(start),
        PyLong_FromSsize_t(count),
        PyLong_FromUnsignedLongLong(first_sssn),
        PyLong_FromUnsignedLongLong(submit_min),
        PyLong_FromUnsignedLongLong(submit_max),
        int_from_be128(hash_min),
        int_from_be128(hash_max),
        PyBytes_FromStringAndSize((const char *)sigs + 16 * start, 16 * count),
        PyBytes_FromStringAndSize((const char *)submits + 8 * start, 8 * count),
        PyBytes_FromStringAndSize((const char *)stored, (Py_ssize_t)stored_len),
        PyLong_FromLongLong(size),
    };
    int bad = 0;
    for (int j = 0; j < 12; j++) {
        if (items[j] == NULL)
            bad = 1;
        PyTuple_SET_ITEM(run, j, items[j]);
    }
    if (bad || PyList_Append(out, run) < 0) {
        Py_DECREF(run);
        return -1;
    }
    Py_DECREF(run);
    return 0;
}

/* put_runs(count, blob, producer_id, session_id, ordinals) -> [(ordinal, start, count, first_sssn, submit_min,
 * submit_max, hash_min, hash_max, signatures, submits, stored, size)] or None: see sms.wire._put_runs. */
static PyObject *
w_put_runs(PyObject *self, PyObject *args)
{
    Py_ssize_t count;
    Py_buffer blob, pid, sid, ords;
    if (!PyArg_ParseTuple(args, "ny*y*y*y*", &count, &blob, &pid, &sid, &ords))
        return NULL;
    PyObject *out = NULL;
    Buf stored = {0};
    unsigned char *sigs = NULL, *submits = NULL;
    if (check_configured() < 0)
        goto done;
    const unsigned char *b = blob.buf, *op = ords.buf;
    size_t n = (size_t)blob.len;
    long long put_meta_max = 2 * 5 + 16 + 8 + 8 + 4 + DEDUP_KEY_BYTES_MAX;
    long long headers_meta_max = RECORD_HEADERS_BYTES_MAX + RECORD_HEADERS_MAX * 4;
    if (pid.len == 0 || sid.len == 0 || sid.len > 0xFF || count < 1 || count > PUT_RECORDS_COUNT_MAX ||
        ords.len != 4 * count || pid.len > PRODUCER_ID_BYTES_MAX ||
        (long long)n > PUT_RECORDS_BYTES_MAX + count * (ENTRY_BYTES + put_meta_max + headers_meta_max))
        goto none;
    sigs = PyMem_Malloc(16 * (size_t)count);
    submits = PyMem_Malloc(8 * (size_t)count);
    if (sigs == NULL || submits == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    const size_t meta_len_out = 2 + (size_t)sid.len + 10;
    size_t offset = 0, stored_start = 0;
    long long total = 0, run_size = 0;
    Py_ssize_t run_start = 0;
    uint32_t run_ordinal = 0;
    uint64_t prev_sssn = 0, first_sssn = 0, submit_min = 0, submit_max = 0;
    unsigned char digest[16], hash_min[16], hash_max[16];
    for (Py_ssize_t i = 0; i < count; i++) {
        if (offset + ENTRY_BYTES > n)
            goto none;
        size_t data_len = le32(b + offset), key_len = le16(b + offset + 4), meta_len = le16(b + offset + 6);
        size_t k = offset + ENTRY_BYTES, m = k + key_len, d = m + meta_len;
        offset = d + data_len;
        if (offset > n || (long long)data_len > RECORD_DATA_BYTES_MAX)
            goto none;
        Py_ssize_t chars = 0;
        int ok = key_chars(b + k, key_len, &chars);
        if (ok < 0)
            goto fail;
        if (!ok || chars < PARTITION_KEY_CHARS_MIN || chars > PARTITION_KEY_CHARS_MAX)
            goto none;
        if (meta_len != 20 || b[m] != TAG_SSSN || b[m + 1] != 8 || b[m + 10] != TAG_SUBMIT_MS || b[m + 11] != 8)
            goto none;
        uint64_t sssn = be64(b + m + 2), submit_ms = be64(b + m + 12);
        uint32_t ordinal = le32(op + 4 * i);
        md5(b + k, key_len, digest);
        if (i == 0 || ordinal != run_ordinal || prev_sssn == UINT64_MAX || sssn != prev_sssn + 1) {
            if (i > 0 && append_run(out, run_ordinal, run_start, i, first_sssn, submit_min, submit_max, hash_min,
                                    hash_max, sigs, submits, stored.p + stored_start, stored.len - stored_start,
                                    run_size) < 0)
                goto fail;
            run_start = i;
            run_ordinal = ordinal;
            first_sssn = sssn;
            submit_min = submit_max = submit_ms;
            memcpy(hash_min, digest, 16);
            memcpy(hash_max, digest, 16);
            stored_start = stored.len;
            run_size = 0;
        } else {
            if (submit_ms < submit_min)
                submit_min = submit_ms;
            if (submit_ms > submit_max)
                submit_max = submit_ms;
            if (memcmp(digest, hash_min, 16) < 0)
                memcpy(hash_min, digest, 16);
            if (memcmp(digest, hash_max, 16) > 0)
                memcpy(hash_max, digest, 16);
        }
        prev_sssn = sssn;
        signature_into(sigs + 16 * i, b + k, key_len, b + d, data_len, NULL, 0);
        for (int j = 0; j < 8; j++)
            submits[8 * i + j] = (unsigned char)(submit_ms >> (8 * j));
        if (buf_reserve(&stored, ENTRY_BYTES + key_len + meta_len_out + data_len) < 0)
            goto fail;
        unsigned char *w = stored.p + stored.len;
        put_le32(w, (uint32_t)data_len);
        put_le16(w + 4, (uint16_t)key_len);
        put_le16(w + 6, (uint16_t)meta_len_out);
        w += ENTRY_BYTES;
        memcpy(w, b + k, key_len);
        w += key_len;
        w[0] = TAG_PRODUCER_ID;
        w[1] = (unsigned char)sid.len;
        memcpy(w + 2, sid.buf, (size_t)sid.len);
        w += 2 + sid.len;
        w[0] = TAG_SSSN;
        w[1] = 8;
        put_be64(w + 2, sssn);
        w += 10;
        memcpy(w, b + d, data_len);
        stored.len += ENTRY_BYTES + key_len + meta_len_out + data_len;
        total += (long long)(data_len + key_len);
        run_size += (long long)(data_len + key_len);
    }
    if (offset != n || total > PUT_RECORDS_BYTES_MAX)
        goto none;
    if (append_run(out, run_ordinal, run_start, count, first_sssn, submit_min, submit_max, hash_min, hash_max, sigs,
                   submits, stored.p + stored_start, stored.len - stored_start, run_size) < 0)
        goto fail;
    goto done;
none:
    Py_XDECREF(out);
    out = Py_NewRef(Py_None);
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(stored.p);
    PyMem_Free(sigs);
    PyMem_Free(submits);
    PyBuffer_Release(&blob);
    PyBuffer_Release(&pid);
    PyBuffer_Release(&sid);
    PyBuffer_Release(&ords);
    return out;
}

/* ---- the module --------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Hand over the classes, error types, verify() and limits of sms.wire."},
    {"encode_puts", w_encode_puts, METH_VARARGS, "encode_puts(records, fallback) -> (entries, hash keys)"},
    {"parse_put", w_parse_put, METH_VARARGS, "parse_put(count, blob, producer_id) -> [PutEntry]"},
    {"stored_entries", w_stored_entries, METH_O, "stored_entries(records) -> bytes"},
    {"check_framing", w_check_framing, METH_VARARGS, "check_framing(buf, count, offset=0) -> None"},
    {"check_records", w_check_records, METH_VARARGS, "check_records(buf, count, offset=0) -> None"},
    {"decode_records", w_decode_records, METH_VARARGS, "decode_records(batch, start, end, ordinal) -> [Record]"},
    {"session_fields", w_session_fields, METH_VARARGS, "session_fields(batch, start, end) -> [SessionFields]"},
    {"columns", w_columns, METH_VARARGS, "columns(batch, start, end) -> (count, 12 column buffers)"},
    {"columns_many", w_columns_many, METH_O, "columns_many([(batch, start, end), ...]) -> one set of columns"},
    {"signature", w_signature, METH_VARARGS, "signature(key, data, headers=b'') -> 16 bytes"},
    {"encode_session_entries", w_encode_session_entries, METH_VARARGS,
     "encode_session_entries(records, submit_ms) -> [entry bytes]"},
    {"decode_put_results", w_decode_put_results, METH_VARARGS,
     "decode_put_results(sequence_numbers, ordinals, count) -> (SNs, ordinals)"},
    {"put_runs", w_put_runs, METH_VARARGS,
     "put_runs(count, blob, producer_id, session_id, ordinals) -> [run] or None"},
    {"hash_key", w_hash_key, METH_O, "hash_key(key bytes) -> int (MD5, big-endian)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sms._wire",
                                    "The compiled implementation of sms.wire's hot functions.", -1, methods};

PyMODINIT_FUNC
PyInit__wire(void)
{
    s_key = PyUnicode_InternFromString("key");
    s_data = PyUnicode_InternFromString("data");
    s_sssn = PyUnicode_InternFromString("sssn");
    s_dedup_key = PyUnicode_InternFromString("dedup_key");
    s_session_ordinal = PyUnicode_InternFromString("session_ordinal");
    s_headers = PyUnicode_InternFromString("headers");
    s_producer_id = PyUnicode_InternFromString("producer_id");
    s_extra = PyUnicode_InternFromString("extra");
    if (!s_extra || !s_producer_id || !s_key || !s_data || !s_sssn || !s_dedup_key || !s_session_ordinal || !s_headers)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "HEADER_BYTES", HEADER_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
