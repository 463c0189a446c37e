/*
 * A stand-in for the CUDA driver library, for test_staging on hosts without a GPU: loaded
 * through XFER_CUDA_LIB, it lets the framework's own CUDA code - memory detection,
 * registration of XFER_MEM_CUDA, the staging pipeline's CUDA copy engine with its stream,
 * events and context switches - run against the driver API as libxfer calls it. It stands in
 * for the GPU alone; nothing of xfer is replaced.
 *
 * "Device memory" is an address range reserved PROT_NONE, as a device pointer is not
 * CPU-addressable: a transport that touched it instead of staging it would fault. Its bytes
 * live in a host shadow that only the copy functions reach. Asynchronous copies queue on
 * their stream and run one per three cuEventQuery calls (all at cuStreamSynchronize), so an
 * event reports NOT_READY until the copies before it ran, like a copy engine that takes its
 * time: a pipeline that used a bounce buffer before its event said so moves wrong bytes.
 * Kernels: the one it runs is shm's gather kernel (shm_cuda_gather.cu), by what it does, in
 * stream order; an entry outside device memory faults it, as on a GPU.
 * Only what libxfer and xfer_perf (-m cuda: cuMemAlloc, cuMemsetD8, synchronous copies) use
 * is implemented; the rest are missing symbols.
 *
 * CUDA IPC between processes: a device allocation's shadow is a memfd, shared with the
 * process that opens its handle (cuIpcGetMemHandle names the owner's pid and descriptor,
 * cuIpcOpenMemHandle maps it through /proc/<pid>/fd behind a PROT_NONE range of its own), so
 * copies into an opened handle land in the owner's device memory. As with the driver, a
 * handle is of an allocation's base, is not opened by its own process, and an opened range
 * cannot be exported again. A forked child does not inherit device memory (MADV_DONTFORK).
 *
 * This file holds the driver's identity, devices, contexts, pointer attributes, allocations
 * and IPC handles; fake_cuda_stream.c holds streams, events and copies (with the kernel and
 * cuMemcpyBatchAsync), fake_cuda.h what the two share.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cuda.h"

#define MAX_ALLOCS  64

/* What cuIpcGetMemHandle writes into the 64-byte handle. */
typedef struct ipc_handle {
    char               magic[8];
    int                pid, fd;
    unsigned long long size, buffer_id;
} ipc_handle_t;

typedef struct {
    char reserved[64];
} cu_ipc_handle_t;

pthread_mutex_t        fc_lock = PTHREAD_MUTEX_INITIALIZER;
__thread void          *fc_current;
static int             initialised;
static alloc_t         allocs[MAX_ALLOCS];
static unsigned long long next_buffer_id = 1;
static int             primary_token;   /* the one context: its address */
static int             primary_refs;

alloc_t *fc_find(const void *p)
{
    for (int i = 0; i < MAX_ALLOCS; i++) {
        alloc_t *a = &allocs[i];

        if ((a->base != NULL) && ((const char*)p >= a->base) &&
            ((const char*)p < a->base + a->size)) {
            return a;
        }
    }
    return NULL;
}

/* Where the bytes at p really are: the shadow of device memory, or p itself. */
void *fc_real(const void *p)
{
    alloc_t *a = fc_find(p);

    return ((a != NULL) && !a->host) ? a->shadow + ((const char*)p - a->base) : (void*)p;
}

/* 1 when [p, p + len) lies in one allocation of device memory (a kernel reaches nothing else). */
int fc_device_range(const void *p, size_t len)
{
    alloc_t *a = fc_find(p);

    return (a != NULL) && !a->host && (len <= a->size - (size_t)((const char*)p - a->base));
}

EXPORT int cuInit(unsigned flags)
{
    (void)flags;
    initialised = 1;
    return SUCCESS;
}

EXPORT int cuDriverGetVersion(int *v)
{
    *v = 12040;
    return SUCCESS;
}

EXPORT int cuGetErrorName(int res, const char **name)
{
    *name = (res == NOT_READY) ? "CUDA_ERROR_NOT_READY" : "CUDA_ERROR_FAKE";
    return SUCCESS;
}

EXPORT int cuGetErrorString(int res, const char **text)
{
    (void)res;
    *text = "an error of the test's stand-in driver";
    return SUCCESS;
}

EXPORT int cuDeviceGetCount(int *count)
{
    *count = initialised ? 1 : 0;
    return initialised ? SUCCESS : NOT_INITIALIZED;
}

EXPORT int cuDeviceGet(int *dev, int ordinal)
{
    *dev = 0;
    return (ordinal == 0) ? SUCCESS : INVALID_VALUE;
}

EXPORT int cuDeviceGetName(char *name, int len, int dev)
{
    (void)dev;
    strncpy(name, "stand-in GPU", (size_t)len);
    return SUCCESS;
}

/* FAKE_CUDA_PCI_BUS_ID places the GPU in a test's PCI topology (HWLOC_XMLFILE). */
EXPORT int cuDeviceGetPCIBusId(char *id, int len, int dev)
{
    const char *where = getenv("FAKE_CUDA_PCI_BUS_ID");

    (void)dev;
    if ((len <= 0) || (id == NULL)) {
        return INVALID_VALUE;
    }
    snprintf(id, (size_t)len, "%s", (where != NULL) ? where : "0000:00:00.0");
    return SUCCESS;
}

EXPORT int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    (void)attr;
    (void)dev;
    *v = 0;
    return SUCCESS;
}

EXPORT int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    (void)dev;
    pthread_mutex_lock(&fc_lock);
    primary_refs++;
    pthread_mutex_unlock(&fc_lock);
    *ctx = &primary_token;
    return SUCCESS;
}

EXPORT int cuDevicePrimaryCtxRelease_v2(int dev)
{
    (void)dev;
    pthread_mutex_lock(&fc_lock);
    primary_refs--;
    pthread_mutex_unlock(&fc_lock);
    return SUCCESS;
}

EXPORT int cuCtxGetCurrent(void **ctx)
{
    *ctx = fc_current;
    return SUCCESS;
}

EXPORT int cuCtxSetCurrent(void *ctx)
{
    if ((ctx != NULL) && (ctx != &primary_token)) {
        return INVALID_CONTEXT;
    }
    fc_current = ctx;
    return SUCCESS;
}

EXPORT int cuPointerGetAttributes(unsigned num, int *attrs, void **data, cu_ptr_t ptr)
{
    alloc_t *a;

    if (!initialised) {
        return NOT_INITIALIZED;
    }
    pthread_mutex_lock(&fc_lock);
    a = fc_find((const void*)(uintptr_t)ptr);
    for (unsigned i = 0; i < num; i++) {
        switch (attrs[i]) {
        case 1: *(void**)data[i] = a ? (void*)&primary_token : NULL; break;      /* CONTEXT */
        case 2: *(unsigned*)data[i] = a ? (a->host ? 1u : 2u) : 0u; break;      /* TYPE */
        case 7: *(unsigned long long*)data[i] = a ? a->buffer_id : 0; break;    /* BUFFER_ID */
        case 8: *(int*)data[i] = 0; break;                                      /* MANAGED */
        case 9: *(int*)data[i] = a ? 0 : -1; break;                             /* ORDINAL */
        default: break;
        }
    }
    pthread_mutex_unlock(&fc_lock);
    return SUCCESS;
}

EXPORT int cuPointerSetAttribute(const void *value, int attr, cu_ptr_t ptr)
{
    (void)value;
    (void)attr;
    return fc_find((const void*)(uintptr_t)ptr) ? SUCCESS : INVALID_VALUE;
}

EXPORT int cuMemGetAddressRange_v2(cu_ptr_t *base, size_t *size, cu_ptr_t ptr)
{
    alloc_t *a;

    pthread_mutex_lock(&fc_lock);
    a = fc_find((const void*)(uintptr_t)ptr);
    if (a != NULL) {
        *base = (uintptr_t)a->base;
        *size = a->size;
    }
    pthread_mutex_unlock(&fc_lock);
    return a ? SUCCESS : INVALID_VALUE;
}

/* The shadow of size bytes of device memory: a new memfd (*fd_p < 0 on entry), or one
 * opened from another process's handle, mapped shared. NULL on failure, a memfd made here
 * closed again. */
static char *shadow_map(size_t size, int *fd_p)
{
    int fd = (*fd_p >= 0) ? *fd_p : memfd_create("fake-cuda-device", MFD_CLOEXEC);
    char *shadow = MAP_FAILED;

    if ((fd >= 0) && ((*fd_p >= 0) || (ftruncate(fd, (off_t)size) == 0))) {
        shadow = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (shadow == MAP_FAILED) {
        if ((fd >= 0) && (*fd_p < 0)) {
            close(fd);
        }
        return NULL;
    }
    (void)madvise(shadow, size, MADV_DONTFORK);
    *fd_p = fd;
    return shadow;
}

/* A free slot for an allocation of size bytes at a new PROT_NONE (host: read-write) range,
 * its shadow a memfd (fd >= 0: opened from a handle) unless host; called with fc_lock held. */
static alloc_t *alloc_slot(size_t size, int host, int fd)
{
    for (int i = 0; i < MAX_ALLOCS; i++) {
        alloc_t *a = &allocs[i];

        if (a->base != NULL) {
            continue;
        }
        a->fd   = fd;
        a->base = mmap(NULL, size, host ? PROT_READ | PROT_WRITE : PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a->base == MAP_FAILED) {
            memset(a, 0, sizeof(*a));
            return NULL;
        }
        a->shadow = host ? NULL : shadow_map(size, &a->fd);
        if (!host && (a->shadow == NULL)) {
            munmap(a->base, size);
            memset(a, 0, sizeof(*a));
            return NULL;
        }
        (void)madvise(a->base, size, MADV_DONTFORK);
        a->size      = size;
        a->host      = host;
        a->buffer_id = next_buffer_id++;
        return a;
    }
    return NULL;
}

static int alloc_new(size_t size, int host, void **p)
{
    alloc_t *a;

    pthread_mutex_lock(&fc_lock);
    a = alloc_slot(size, host, -1);
    if (a != NULL) {
        *p = a->base;
    }
    pthread_mutex_unlock(&fc_lock);
    return (a != NULL) ? SUCCESS : INVALID_VALUE;
}

static void alloc_release(alloc_t *a)
{
    munmap(a->base, a->size);
    if (a->shadow != NULL) {
        munmap(a->shadow, a->size);
        close(a->fd);
    }
    memset(a, 0, sizeof(*a));
}

static int alloc_free(void *p)
{
    alloc_t *a;

    pthread_mutex_lock(&fc_lock);
    a = fc_find(p);
    if ((a == NULL) || (a->base != p) || a->imported) {
        pthread_mutex_unlock(&fc_lock);
        return INVALID_VALUE;
    }
    alloc_release(a);
    pthread_mutex_unlock(&fc_lock);
    return SUCCESS;
}

EXPORT int cuMemAlloc_v2(cu_ptr_t *ptr, size_t size)
{
    void *p  = NULL;
    int res;

    if (fc_current == NULL) {
        return INVALID_CONTEXT;
    }
    res = alloc_new(size, 0, &p);
    *ptr = (uintptr_t)p;
    return res;
}

EXPORT int cuMemFree_v2(cu_ptr_t ptr)
{
    return alloc_free((void*)(uintptr_t)ptr);
}

EXPORT int cuMemHostAlloc(void **p, size_t size, unsigned flags)
{
    (void)flags;
    return (fc_current == NULL) ? INVALID_CONTEXT : alloc_new(size, 1, p);
}

EXPORT int cuMemFreeHost(void *p)
{
    return alloc_free(p);
}

EXPORT int cuIpcGetMemHandle(cu_ipc_handle_t *handle, cu_ptr_t ptr)
{
    ipc_handle_t h;
    alloc_t *a;

    memset(handle, 0, sizeof(*handle));
    pthread_mutex_lock(&fc_lock);
    a = fc_find((const void*)(uintptr_t)ptr);
    if ((a == NULL) || a->host || a->imported || (a->base != (char*)(uintptr_t)ptr)) {
        pthread_mutex_unlock(&fc_lock);
        return INVALID_VALUE;
    }
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, "fakeipc", 8);
    h.pid       = (int)getpid();
    h.fd        = a->fd;
    h.size      = a->size;
    h.buffer_id = a->buffer_id;
    pthread_mutex_unlock(&fc_lock);
    memcpy(handle, &h, sizeof(h));
    return SUCCESS;
}

EXPORT int cuIpcOpenMemHandle_v2(cu_ptr_t *ptr, cu_ipc_handle_t handle, unsigned flags)
{
    char path[64];
    ipc_handle_t h;
    struct stat st;
    alloc_t *a;
    int fd;

    (void)flags;
    memcpy(&h, &handle, sizeof(h));
    if (fc_current == NULL) {
        return INVALID_CONTEXT;
    }
    if ((memcmp(h.magic, "fakeipc", 8) != 0) || (h.size == 0)) {
        return INVALID_VALUE;
    }
    if (h.pid == (int)getpid()) {
        return INVALID_CONTEXT;     /* the driver's answer to a process opening its own */
    }
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return INVALID_HANDLE;
    }
    if ((fstat(fd, &st) != 0) || ((unsigned long long)st.st_size != h.size)) {
        close(fd);
        return INVALID_HANDLE;
    }
    pthread_mutex_lock(&fc_lock);
    a = alloc_slot(h.size, 0, fd);
    if (a != NULL) {
        a->imported = 1;
        *ptr        = (uintptr_t)a->base;
    }
    pthread_mutex_unlock(&fc_lock);
    if (a == NULL) {
        close(fd);
        return INVALID_VALUE;
    }
    return SUCCESS;
}

EXPORT int cuIpcCloseMemHandle(cu_ptr_t ptr)
{
    alloc_t *a;

    pthread_mutex_lock(&fc_lock);
    a = fc_find((const void*)(uintptr_t)ptr);
    if ((a == NULL) || !a->imported || (a->base != (char*)(uintptr_t)ptr)) {
        pthread_mutex_unlock(&fc_lock);
        return INVALID_VALUE;
    }
    alloc_release(a);
    pthread_mutex_unlock(&fc_lock);
    return SUCCESS;
}
