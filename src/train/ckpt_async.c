/* Checkpoints written by a thread beside training (train/ckpt_async.h). */
#include "train/ckpt_async.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/device.h"
#include "core/timer.h"
#include "train/ckpt_dist.h"

struct CkptAsync {
    float *staging; /* every staged tensor, one after another */
    size_t cap;     /* floats */
    CkptTensor *tensors;
    int ntensors_cap;
    /* the write in flight */
    CkptAsyncTarget to;
    char *root;
    int mesh[4];
    CkptState st;
    int nmodel, noptim;
    pthread_t thread;
    int started;
    atomic_int finished;
    int rc;
    Err err;
    double seconds;
};

CkptAsync *ckpt_async_new(void) {
    CkptAsync *a = xcalloc(1, sizeof *a);
    atomic_init(&a->finished, 0);
    return a;
}

static void *writer(void *arg) {
    CkptAsync *a = arg;
    /* One thread at the lowest priority: the training steps keep the cores (ckpt_save's
     * checksum pass is parallel), and the write takes what they leave. */
    omp_set_num_threads(1);
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) != 0) { /* best effort */
    }
    double t0 = now_seconds();
    const CkptTensor *model = a->tensors, *optim = a->tensors + a->nmodel;
    a->rc = a->to.ranks > 0
                ? ckpt_dist_write(a->to.rank, a->to.ranks, a->mesh, a->root, &a->st, model,
                                  a->to.slices, a->nmodel, optim, a->noptim, &a->err)
                : ckpt_save(a->root, &a->st, model, a->nmodel, optim, a->noptim,
                            a->to.keep_latest_k, &a->err);
    a->seconds = now_seconds() - t0;
    atomic_store(&a->finished, 1);
    return NULL;
}

/* Copies n tensors into the staging buffer from float offset *at on. */
static void stage(CkptAsync *a, CkptTensor *dst, const CkptTensor *src, int n, size_t *at) {
    for (int i = 0; i < n; i++) {
        dst[i] = src[i];
        size_t bytes = (size_t)ckpt_tensor_numel(&src[i]) * sizeof(float);
        float *to = a->staging + *at;
        /* device_host_view copies a device tensor into `to`; host memory it returns as it is. */
        const void *v = device_host_view(ckpt_tensor_device(&src[i]), to, src[i].data, bytes);
        if (v != to) memcpy(to, v, bytes);
        dst[i].data = to;
        dst[i].device = NULL;
        *at += bytes / sizeof(float);
    }
}

int ckpt_async_start(CkptAsync *a, const CkptAsyncTarget *to, const CkptState *st,
                     const CkptTensor *model, int nmodel, const CkptTensor *optim, int noptim,
                     Err *err) {
    if (a->started) return err_set(err, "checkpoint: a background write is still in flight");
    size_t floats = 0;
    for (int i = 0; i < nmodel; i++)
        floats += (size_t)ckpt_tensor_numel(&model[i]);
    for (int i = 0; i < noptim; i++)
        floats += (size_t)ckpt_tensor_numel(&optim[i]);
    if (floats > a->cap) {
        /* The CPU device's pages, mapped by every thread at once (core/device.c): touched
         * for the first time by one memcpy they cost seconds per GiB on some VMs. */
        if (a->staging) device_cpu.release(a->staging, a->cap * sizeof(float));
        a->cap = 0;
        a->staging = device_cpu.alloc(floats * sizeof(float));
        if (!a->staging)
            return err_set(err,
                           "checkpoint: no memory to stage step %lld for a background write "
                           "(%.2f GiB); set checkpoint.async_mode = \"disabled\"",
                           (long long)st->step, (double)floats * sizeof(float) / 1073741824.0);
        a->cap = floats;
    }
    if (nmodel + noptim > a->ntensors_cap) {
        free(a->tensors);
        a->ntensors_cap = nmodel + noptim;
        a->tensors = xcalloc((size_t)a->ntensors_cap, sizeof *a->tensors);
    }
    size_t at = 0;
    stage(a, a->tensors, model, nmodel, &at);
    stage(a, a->tensors + nmodel, optim, noptim, &at);
    a->nmodel = nmodel, a->noptim = noptim;
    a->to = *to;
    free(a->root);
    a->root = xstrdup(to->root);
    if (to->mesh) memcpy(a->mesh, to->mesh, sizeof a->mesh);
    a->st = *st;
    a->st.data_position = st->data_position ? json_deep_copy(st->data_position) : NULL;
    a->st.config = st->config ? json_deep_copy(st->config) : NULL;
    a->rc = 0;
    memset(&a->err, 0, sizeof a->err);
    atomic_store(&a->finished, 0);
    int e = pthread_create(&a->thread, NULL, writer, a);
    if (e != 0) {
        json_decref(a->st.data_position);
        json_decref(a->st.config);
        return err_set(err, "checkpoint: cannot start the background writer for step %lld: %s",
                       (long long)st->step, strerror(e));
    }
    a->started = 1;
    return 0;
}

int ckpt_async_busy(const CkptAsync *a) {
    return a->started && !atomic_load(&a->finished);
}

int ckpt_async_pending(const CkptAsync *a) {
    return a->started;
}

int ckpt_async_wait(CkptAsync *a, int64_t *step, double *seconds, Err *err) {
    if (!a->started) return 0;
    pthread_join(a->thread, NULL);
    a->started = 0;
    json_decref(a->st.data_position);
    json_decref(a->st.config);
    a->st.data_position = a->st.config = NULL;
    if (step) *step = a->st.step;
    if (seconds) *seconds = a->seconds;
    if (a->rc != 0) {
        *err = a->err;
        return -1;
    }
    return 0;
}

size_t ckpt_async_staging_bytes(const CkptAsync *a) {
    return a->cap * sizeof(float);
}

void ckpt_async_free(CkptAsync *a) {
    if (!a) return;
    Err ignore;
    ckpt_async_wait(a, NULL, NULL, &ignore);
    if (a->staging) device_cpu.release(a->staging, a->cap * sizeof(float));
    free(a->tensors);
    free(a->root);
    free(a);
}
