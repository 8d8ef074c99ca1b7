/* Compressed input streams (zread.h): zlib's inflate with gzip framing, libzstd's streaming
 * decompressor, or the plain file, behind one read call. */
#include "core/zread.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "core/fs.h"
#include "core/strutil.h"

#define ZREAD_IN (1u << 16)

typedef enum { Z_PLAIN, Z_GZIP, Z_ZSTD } ZKind;

struct ZRead {
    ZKind kind;
    char *path;
    FILE *f;
    unsigned char *in; /* compressed input buffer */
    size_t in_len, in_pos;
    uint64_t in_off; /* compressed bytes read from the file before in[0] */
    int in_eof;
    z_stream zs;
    int zs_live; /* inflateInit2 was called */
    int gz_done; /* the last member ended exactly (Z_STREAM_END) */
    ZSTD_DStream *zd;
    size_t zd_last; /* ZSTD_decompressStream's last hint: 0 = a frame just ended */
    int started;    /* at least one compressed byte seen */
};

int zread_is_compressed(const char *path) {
    return str_ends_with(path, ".gz") || str_ends_with(path, ".zst");
}

void zread_plain_name(const char *path, char *out) {
    size_t n = strlen(path);
    if (str_ends_with(path, ".gz"))
        n -= 3;
    else if (str_ends_with(path, ".zst"))
        n -= 4;
    memcpy(out, path, n);
    out[n] = 0;
}

int zread_open(ZRead **out, const char *path, Err *err) {
    *out = NULL;
    struct stat st;
    int fd = fs_open_read(path, &st, err);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        err_sys(err, "cannot open %s", path);
        close(fd);
        return -1;
    }
    return zread_open_stream(out, f, path, err);
}

int zread_open_stream(ZRead **out, FILE *f, const char *path, Err *err) {
    *out = NULL;
    ZRead *z = xcalloc(1, sizeof *z);
    z->f = f;
    z->path = xstrdup(path);
    z->kind = str_ends_with(path, ".gz") ? Z_GZIP : str_ends_with(path, ".zst") ? Z_ZSTD : Z_PLAIN;
    if (z->kind != Z_PLAIN) z->in = xmalloc(ZREAD_IN);
    if (z->kind == Z_GZIP) {
        /* 15 + 16: a gzip wrapper, as .gz files have (zlib checks its CRC-32 and length). */
        if (inflateInit2(&z->zs, 15 + 16) != Z_OK) {
            zread_close(z);
            return err_set(err, "%s: cannot start the gzip decoder", path);
        }
        z->zs_live = 1;
    } else if (z->kind == Z_ZSTD) {
        z->zd = ZSTD_createDStream();
        if (!z->zd || ZSTD_isError(ZSTD_initDStream(z->zd))) {
            zread_close(z);
            return err_set(err, "%s: cannot start the zstd decoder", path);
        }
    }
    *out = z;
    return 0;
}

unsigned long long zread_in_offset(const ZRead *z) {
    if (z->kind == Z_PLAIN) return (unsigned long long)ftell(z->f);
    return (unsigned long long)(z->in_off + z->in_pos);
}

void zread_close(ZRead *z) {
    if (!z) return;
    if (z->zs_live) inflateEnd(&z->zs);
    if (z->zd) ZSTD_freeDStream(z->zd);
    if (z->f) fclose(z->f);
    free(z->in);
    free(z->path);
    free(z);
}

/* Refills the compressed buffer when it is used up; sets in_eof at the end of the file. */
static int fill(ZRead *z, Err *err) {
    if (z->in_pos < z->in_len || z->in_eof) return 0;
    z->in_off += z->in_len;
    z->in_len = fread(z->in, 1, ZREAD_IN, z->f);
    z->in_pos = 0;
    if (z->in_len == 0) {
        if (ferror(z->f))
            return err_sys(err, "%s: read error at byte %llu", z->path,
                           (unsigned long long)z->in_off);
        z->in_eof = 1;
    }
    return 0;
}

static int read_gzip(ZRead *z, void *buf, size_t cap, size_t *got, Err *err) {
    *got = 0;
    while (*got == 0) {
        TRY(fill(z, err));
        if (z->in_eof) {
            if (!z->started) return err_set(err, "%s: empty file; expected gzip data", z->path);
            if (!z->gz_done)
                return err_set(err,
                               "%s: truncated gzip data: the file ends at byte %llu inside a "
                               "compressed stream",
                               z->path, (unsigned long long)z->in_off);
            return 0;
        }
        if (z->gz_done) {
            /* Another member follows (gzip files may be concatenated). */
            if (inflateReset(&z->zs) != Z_OK)
                return err_set(err, "%s: cannot restart the gzip decoder", z->path);
            z->gz_done = 0;
        }
        z->started = 1;
        z->zs.next_in = z->in + z->in_pos;
        z->zs.avail_in = (uInt)(z->in_len - z->in_pos);
        z->zs.next_out = (Bytef *)buf;
        z->zs.avail_out = (uInt)(cap > UINT32_MAX ? UINT32_MAX : cap);
        int rc = inflate(&z->zs, Z_NO_FLUSH);
        size_t used = (z->in_len - z->in_pos) - z->zs.avail_in;
        uint64_t at = z->in_off + z->in_pos;
        z->in_pos += used;
        *got = (size_t)((unsigned char *)z->zs.next_out - (unsigned char *)buf);
        if (rc == Z_STREAM_END) {
            z->gz_done = 1;
        } else if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
            return err_set(err, "%s: corrupt gzip data near compressed byte %llu (%s)", z->path,
                           (unsigned long long)(at + used),
                           z->zs.msg ? z->zs.msg : "invalid stream");
        } else if (rc == Z_MEM_ERROR) {
            return err_set(err, "%s: out of memory while decompressing", z->path);
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            return err_set(err, "%s: gzip decoder error %d near compressed byte %llu", z->path, rc,
                           (unsigned long long)(at + used));
        }
    }
    return 0;
}

static int read_zstd(ZRead *z, void *buf, size_t cap, size_t *got, Err *err) {
    *got = 0;
    while (*got == 0) {
        TRY(fill(z, err));
        if (z->in_eof) {
            if (!z->started) return err_set(err, "%s: empty file; expected zstd data", z->path);
            if (z->zd_last != 0)
                return err_set(err,
                               "%s: truncated zstd data: the file ends at byte %llu inside a "
                               "frame",
                               z->path, (unsigned long long)z->in_off);
            return 0;
        }
        z->started = 1;
        ZSTD_inBuffer in = {z->in, z->in_len, z->in_pos};
        ZSTD_outBuffer out = {buf, cap, 0};
        size_t r = ZSTD_decompressStream(z->zd, &out, &in);
        if (ZSTD_isError(r))
            return err_set(err, "%s: corrupt zstd data near compressed byte %llu (%s)", z->path,
                           (unsigned long long)(z->in_off + in.pos), ZSTD_getErrorName(r));
        z->in_pos = in.pos;
        z->zd_last = r;
        *got = out.pos;
    }
    return 0;
}

int zread_read(ZRead *z, void *buf, size_t cap, size_t *got, Err *err) {
    if (cap == 0) {
        *got = 0;
        return 0;
    }
    switch (z->kind) {
    case Z_GZIP:
        return read_gzip(z, buf, cap, got, err);
    case Z_ZSTD:
        return read_zstd(z, buf, cap, got, err);
    case Z_PLAIN:
        break;
    }
    *got = fread(buf, 1, cap, z->f);
    if (*got == 0 && ferror(z->f)) return err_sys(err, "%s: read error", z->path);
    return 0;
}

int zread_all(const char *path, char **data, size_t *len, Err *err) {
    ZRead *z;
    TRY(zread_open(&z, path, err));
    size_t cap = 1 << 20, n = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (cap - n < (1 << 16)) {
            /* The plain size is unknown until the end: a small .gz can unpack to any size. */
            if (cap >= FS_READ_ALL_MAX) {
                free(buf);
                zread_close(z);
                return err_set(err,
                               "%s unpacks to more than the %zu-byte limit for a file read whole",
                               path, FS_READ_ALL_MAX);
            }
            cap *= 2;
            buf = xrealloc(buf, cap + 1);
        }
        size_t got;
        if (zread_read(z, buf + n, cap - n, &got, err) != 0) {
            free(buf);
            zread_close(z);
            return -1;
        }
        if (got == 0) break;
        n += got;
    }
    zread_close(z);
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}

typedef struct Cookie {
    ZRead *z;
    Err *err;
} Cookie;

static ssize_t cookie_read(void *c, char *buf, size_t size) {
    Cookie *k = c;
    size_t got;
    if (zread_read(k->z, buf, size, &got, k->err) != 0) {
        errno = EIO;
        return -1;
    }
    return (ssize_t)got;
}

static int cookie_close(void *c) {
    Cookie *k = c;
    zread_close(k->z);
    free(k);
    return 0;
}

FILE *zread_fopen(const char *path, Err *err) {
    ZRead *z;
    if (zread_open(&z, path, err) != 0) return NULL;
    Cookie *k = xcalloc(1, sizeof *k);
    k->z = z;
    k->err = err;
    cookie_io_functions_t io = {.read = cookie_read, .close = cookie_close};
    FILE *f = fopencookie(k, "rb", io);
    if (!f) {
        cookie_close(k);
        err_sys(err, "cannot open a stream over %s", path);
    }
    return f;
}
