/* NCCL communicator smoke test on one GPU: a one-rank NCCL communicator bootstrapped through
 * the single-process one, every collective on device buffers checked against the host
 * copy it must equal. Exits 77 (skipped) when qtitan was built without CUDA
 * (-DQTITAN_WITH_CUDA=OFF) or no GPU is visible. Several ranks need several GPUs (NCCL
 * refuses two ranks on one device); that runs under mpirun on a multi-GPU host. */
#include <stdio.h>

#ifndef QTITAN_HAVE_NCCL
int main(void) {
    printf("skip: built without CUDA/NCCL\n");
    return 77;
}
#else
#include <cuda_runtime.h>
#include <string.h>

#include "dist/comm.h"

#define OK(call)                                                                                   \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, err.msg);                           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t rc_ = (call);                                                                  \
        if (rc_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(rc_));           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("skip: no CUDA device\n");
        return 77;
    }
    Err err;
    Comm *parent = comm_single_create(), *c, *sub;
    OK(comm_nccl_create(&c, parent, 0, &err));
    if (c->size != 1 || c->rank != 0 || strcmp(c->kind, "nccl") != 0) return 1;
    enum { N = 1000 };
    float host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)i * 0.25f - 7;
    float *a, *b;
    CUDA_OK(cudaMalloc((void **)&a, N * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&b, N * sizeof(float)));
    CUDA_OK(cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice));
    OK(comm_all_reduce_sum(c, a, N, COMM_F32, &err));
    OK(comm_all_gather(c, b, a, N, COMM_F32, &err));
    CUDA_OK(cudaMemset(a, 0, N * sizeof(float)));
    CommReq *req;
    OK(comm_ireduce_scatter_sum(c, a, b, N, COMM_F32, &req, &err));
    OK(comm_wait(c, req, &err));
    OK(comm_broadcast(c, a, N * sizeof(float), 0, &err));
    OK(comm_barrier(c, &err));
    /* One rank's all-to-all is a copy of its own run; an empty one moves nothing. */
    size_t count = N, none = 0;
    CUDA_OK(cudaMemset(b, 0, N * sizeof(float)));
    OK(comm_all_to_all_v(c, b, &count, a, &count, COMM_F32, &err));
    OK(comm_all_to_all_v(c, a, &none, b, &none, COMM_F32, &err));
    CUDA_OK(cudaMemcpy(back, b, sizeof back, cudaMemcpyDeviceToHost));
    if (memcmp(back, host, sizeof host) != 0) {
        fprintf(stderr, "the NCCL all-to-all changed the data\n");
        return 1;
    }
    CUDA_OK(cudaMemcpy(back, a, sizeof back, cudaMemcpyDeviceToHost));
    if (memcmp(back, host, sizeof host) != 0) {
        fprintf(stderr, "NCCL collectives changed the data on one rank\n");
        return 1;
    }
    OK(comm_split(c, 0, 0, &sub, &err));
    if (sub->size != 1) return 1;
    comm_destroy(sub);
    cudaFree(a);
    cudaFree(b);
    comm_destroy(c);
    comm_destroy(parent);
    printf("ok: NCCL communicator on 1 GPU\n");
    return 0;
}
#endif
