/*
 * What the stand-in CUDA driver's two files (fake_cuda.c, fake_cuda_stream.c) share: the
 * driver's error codes, the allocation table's entries and the helpers that look them up,
 * the lock and the thread's current context. The library is built with -fvisibility=hidden,
 * so what is declared here stays internal; only EXPORT entry points are the driver's.
 */
#ifndef XFER_TEST_FAKE_CUDA_H
#define XFER_TEST_FAKE_CUDA_H

#include <pthread.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    SUCCESS             = 0,
    INVALID_VALUE       = 1,
    NOT_INITIALIZED     = 3,
    INVALID_CONTEXT     = 201,
    INVALID_HANDLE      = 400,
    NOT_READY           = 600,
    NOT_SUPPORTED       = 801,
    INVALID_PTX         = 218,
    UNSUPPORTED_PTX_VERSION = 222,
    NOT_FOUND           = 500,
    ILLEGAL_ADDRESS     = 700,
};

typedef unsigned long long cu_ptr_t;

typedef struct alloc {
    char               *base;      /* the PROT_NONE range handed out */
    char               *shadow;    /* its bytes */
    size_t             size;
    unsigned long long buffer_id;
    int                host;       /* cuMemHostAlloc: real host memory, no shadow */
    int                fd;         /* the shadow's memfd (device memory of this process) */
    int                imported;   /* opened from another process's IPC handle */
} alloc_t;

/* Guards the allocation table and every stream and event. */
extern pthread_mutex_t fc_lock;
/* The context current on this thread: NULL or the primary one. */
extern __thread void   *fc_current;

/* The allocation p lies in, NULL if none. */
alloc_t *fc_find(const void *p);
/* Where the bytes at p really are: the shadow of device memory, or p itself. */
void *fc_real(const void *p);
/* 1 when [p, p + len) lies in one allocation of device memory (a kernel reaches nothing else). */
int fc_device_range(const void *p, size_t len);

#endif
