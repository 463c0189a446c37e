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

#define MAX_ALLOCS  64
#define MAX_QUEUED  1024

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

/* What cuIpcGetMemHandle writes into the 64-byte handle. */
typedef struct ipc_handle {
    char               magic[8];
    int                pid, fd;
    unsigned long long size, buffer_id;
} ipc_handle_t;

typedef struct {
    char reserved[64];
} cu_ipc_handle_t;

typedef struct copy {
    void       *dst;
    const void *src;
    size_t     len;
    uint64_t   seq;
    int        gather;             /* a launch of xfer_shm_gather: src its table, len its count */
} copy_t;

typedef struct stream {
    copy_t     queue[MAX_QUEUED];
    unsigned   head, tail;         /* queue[head..tail) are pending */
    uint64_t   submitted, done;    /* copies ever queued, ever run */
    int        error;              /* a kernel touched what is not device memory: sticky */
} stream_t;

typedef struct event {
    stream_t   *stream;
    uint64_t   seq;                /* done when stream->done reaches it */
} event_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int             initialised;
static alloc_t         allocs[MAX_ALLOCS];
static unsigned long long next_buffer_id = 1;
static int             primary_token;   /* the one context: its address */
static int             primary_refs;
static __thread void   *current;
static unsigned        query_count;     /* cuEventQuery calls, guarded by lock */

static alloc_t *find(const void *p)
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
static void *real(const void *p)
{
    alloc_t *a = find(p);

    return ((a != NULL) && !a->host) ? a->shadow + ((const char*)p - a->base) : (void*)p;
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
    pthread_mutex_lock(&lock);
    primary_refs++;
    pthread_mutex_unlock(&lock);
    *ctx = &primary_token;
    return SUCCESS;
}

EXPORT int cuDevicePrimaryCtxRelease_v2(int dev)
{
    (void)dev;
    pthread_mutex_lock(&lock);
    primary_refs--;
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

EXPORT int cuCtxGetCurrent(void **ctx)
{
    *ctx = current;
    return SUCCESS;
}

EXPORT int cuCtxSetCurrent(void *ctx)
{
    if ((ctx != NULL) && (ctx != &primary_token)) {
        return INVALID_CONTEXT;
    }
    current = ctx;
    return SUCCESS;
}

EXPORT int cuPointerGetAttributes(unsigned num, int *attrs, void **data, cu_ptr_t ptr)
{
    alloc_t *a;

    if (!initialised) {
        return NOT_INITIALIZED;
    }
    pthread_mutex_lock(&lock);
    a = find((const void*)(uintptr_t)ptr);
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
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

EXPORT int cuPointerSetAttribute(const void *value, int attr, cu_ptr_t ptr)
{
    (void)value;
    (void)attr;
    return find((const void*)(uintptr_t)ptr) ? SUCCESS : INVALID_VALUE;
}

EXPORT int cuMemGetAddressRange_v2(cu_ptr_t *base, size_t *size, cu_ptr_t ptr)
{
    alloc_t *a;

    pthread_mutex_lock(&lock);
    a = find((const void*)(uintptr_t)ptr);
    if (a != NULL) {
        *base = (uintptr_t)a->base;
        *size = a->size;
    }
    pthread_mutex_unlock(&lock);
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
 * its shadow a memfd (fd >= 0: opened from a handle) unless host; called with lock held. */
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

    pthread_mutex_lock(&lock);
    a = alloc_slot(size, host, -1);
    if (a != NULL) {
        *p = a->base;
    }
    pthread_mutex_unlock(&lock);
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

    pthread_mutex_lock(&lock);
    a = find(p);
    if ((a == NULL) || (a->base != p) || a->imported) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    alloc_release(a);
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

EXPORT int cuMemAlloc_v2(cu_ptr_t *ptr, size_t size)
{
    void *p  = NULL;
    int res;

    if (current == NULL) {
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
    return (current == NULL) ? INVALID_CONTEXT : alloc_new(size, 1, p);
}

EXPORT int cuMemFreeHost(void *p)
{
    return alloc_free(p);
}

/* Copy len bytes into what real() gives. FAKE_CUDA_LAST_BYTE_FIRST=1: a copy into device
 * memory lands its last byte first and the rest 2 ms later, as a copy spread over several
 * engines may - a reader polling the last byte then sees it before the bytes ahead of it. */
static void land(void *dst, const void *src, size_t len)
{
    const char *lbf = getenv("FAKE_CUDA_LAST_BYTE_FIRST");
    char *d = real(dst);

    if ((lbf != NULL) && (strcmp(lbf, "1") == 0) && (d != dst) && (len > 1)) {
        d[len - 1] = ((const char*)real(src))[len - 1];
        usleep(2000);
        len--;
    }
    memcpy(d, real(src), len);
}

static int copy_now(void *dst, const void *src, size_t len)
{
    pthread_mutex_lock(&lock);
    land(dst, src, len);
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

EXPORT int cuMemsetD8_v2(cu_ptr_t dst, unsigned char value, size_t len)
{
    pthread_mutex_lock(&lock);
    memset(real((void*)(uintptr_t)dst), value, len);
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

/* Synchronous copies and memsets land before they return: nothing is left to wait for. */
EXPORT int cuCtxSynchronize(void)
{
    return (current == NULL) ? INVALID_CONTEXT : SUCCESS;
}

EXPORT int cuMemcpyHtoD_v2(cu_ptr_t dst, const void *src, size_t len)
{
    return copy_now((void*)(uintptr_t)dst, src, len);
}

EXPORT int cuMemcpyDtoH_v2(void *dst, cu_ptr_t src, size_t len)
{
    return copy_now(dst, (const void*)(uintptr_t)src, len);
}

/* 1 when [p, p + len) lies in one allocation of device memory (a kernel reaches nothing else). */
static int device_range(const void *p, size_t len)
{
    alloc_t *a = find(p);

    return (a != NULL) && !a->host && (len <= a->size - (size_t)((const char*)p - a->base));
}

/* What xfer_shm_gather does, when the launch's turn comes (its table read then, as the GPU
 * reads it): each entry {dst, src, len} copied; an entry outside device memory fails the
 * stream with CUDA_ERROR_ILLEGAL_ADDRESS and moves nothing, as the kernel would fault.
 * FAKE_CUDA_GATHER_WRONG=1: each entry's last byte is not copied - a kernel the driver
 * compiled wrong, which no GPU here can be made to produce. */
typedef struct gather_desc {
    unsigned long long dst, src, len;
} gather_desc_t;

static void gather_run(stream_t *s, const gather_desc_t *table, size_t count)
{
    const char *w = getenv("FAKE_CUDA_GATHER_WRONG");
    int wrong     = (w != NULL) && (strcmp(w, "1") == 0);

    for (size_t k = 0; k < count; k++) {
        const void *dst = (const void*)(uintptr_t)table[k].dst;
        const void *src = (const void*)(uintptr_t)table[k].src;

        if (!device_range(dst, table[k].len) || !device_range(src, table[k].len)) {
            fprintf(stderr, "fake_cuda: xfer_shm_gather entry %zu: %llu bytes from %p to %p "
                    "not in device memory\n", k, table[k].len, src, dst);
            s->error = ILLEGAL_ADDRESS;
            return;
        }
    }
    for (size_t k = 0; k < count; k++) {
        land((void*)(uintptr_t)table[k].dst, (const void*)(uintptr_t)table[k].src,
             table[k].len - (wrong && (table[k].len > 0)));
    }
}

/* Run the oldest queued copy of s; 0 when none was queued. */
static int stream_step(stream_t *s)
{
    copy_t *c;

    if (s->head == s->tail) {
        return 0;
    }
    c = &s->queue[s->head % MAX_QUEUED];
    if (c->gather) {
        gather_run(s, c->src, c->len);
    } else {
        land(c->dst, c->src, c->len);
    }
    s->head++;
    s->done++;
    return 1;
}

static int enqueue_op(void *stream, void *dst, const void *src, size_t len, int gather)
{
    stream_t *s = stream;
    int res     = SUCCESS;

    if ((s == NULL) || (current == NULL)) {
        return (s == NULL) ? INVALID_HANDLE : INVALID_CONTEXT;
    }
    pthread_mutex_lock(&lock);
    if (s->tail - s->head >= MAX_QUEUED) {
        res = NOT_SUPPORTED;
    } else {
        s->queue[s->tail % MAX_QUEUED] = (copy_t){dst, src, len, ++s->submitted, gather};
        s->tail++;
    }
    pthread_mutex_unlock(&lock);
    return res;
}

static int enqueue(void *stream, void *dst, const void *src, size_t len)
{
    return enqueue_op(stream, dst, src, len, 0);
}

/* Modules: the one kernel the stand-in runs is shm's xfer_shm_gather, found by its name in
 * the PTX it is given, run by gather_run in stream order. FAKE_CUDA_MODULE_REFUSE=1: every
 * image is refused (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), as by a driver older than the PTX. */
static int module_token, gather_token;
static unsigned long kernel_launches;

EXPORT unsigned long fake_cuda_kernel_launches(void)
{
    return __atomic_load_n(&kernel_launches, __ATOMIC_RELAXED);
}

EXPORT int cuModuleLoadData(void **module, const void *image)
{
    const char *refuse = getenv("FAKE_CUDA_MODULE_REFUSE");

    if (current == NULL) {
        return INVALID_CONTEXT;
    }
    if ((refuse != NULL) && (strcmp(refuse, "1") == 0)) {
        return UNSUPPORTED_PTX_VERSION;
    }
    if (strstr(image, ".entry xfer_shm_gather(") == NULL) {
        return INVALID_PTX;
    }
    *module = &module_token;
    return SUCCESS;
}

EXPORT int cuModuleGetFunction(void **function, void *module, const char *name)
{
    if ((module != &module_token) || (strcmp(name, "xfer_shm_gather") != 0)) {
        return NOT_FOUND;
    }
    *function = &gather_token;
    return SUCCESS;
}

EXPORT int cuModuleUnload(void *module)
{
    return (module == &module_token) ? SUCCESS : INVALID_HANDLE;
}

/* xfer_shm_gather(const desc *table, unsigned count): its parameters as the driver takes
 * them, an array of pointers to each. The table must be host memory the GPU reads (pinned:
 * cuMemHostAlloc) and hold count entries, else the launch is refused. */
EXPORT int cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, void *stream,
                          void **params, void **extra)
{
    unsigned long long table;
    unsigned count;
    alloc_t *a;

    if ((function != &gather_token) || (params == NULL) || (extra != NULL) || (gx == 0) ||
        (gy != 1) || (gz != 1) || (bx == 0) || (bx > 1024) || (by != 1) || (bz != 1) ||
        (shared != 0)) {
        return INVALID_VALUE;
    }
    memcpy(&table, params[0], sizeof(table));
    memcpy(&count, params[1], sizeof(count));
    pthread_mutex_lock(&lock);
    a = find((void*)(uintptr_t)table);
    if ((a == NULL) || !a->host ||
        ((size_t)count * sizeof(gather_desc_t) >
         a->size - (size_t)((char*)(uintptr_t)table - a->base))) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    __atomic_add_fetch(&kernel_launches, 1, __ATOMIC_RELAXED);
    return enqueue_op(stream, NULL, (void*)(uintptr_t)table, count, 1);
}

EXPORT int cuMemcpyAsync(cu_ptr_t dst, cu_ptr_t src, size_t len, void *stream)
{
    return enqueue(stream, (void*)(uintptr_t)dst, (const void*)(uintptr_t)src, len);
}

/* cuMemcpyBatchAsync, CUDA 12.8's form (with failIdx): the driver's checks of its arguments
 * (a stream, attributes whose first index is 0 and whose indices rise below count, a valid
 * source access order), then each copy queued as cuMemcpyAsync queues it. Calls are counted
 * for the suites (fake_cuda_batch_calls). FAKE_CUDA_BATCH_REFUSE=n: the call queues its
 * first n copies and then fails with CUDA_ERROR_NOT_SUPPORTED at copy n - a driver that
 * takes part of a batch before it refuses one of its copies, a fault no real GPU here can be
 * made to produce. */
typedef struct memcpy_attr {
    int      src_access_order;
    int      src_loc[2], dst_loc[2];
    unsigned flags;
} memcpy_attr_t;

static unsigned long batch_calls;

EXPORT unsigned long fake_cuda_batch_calls(void)
{
    return __atomic_load_n(&batch_calls, __ATOMIC_RELAXED);
}

EXPORT int cuMemcpyBatchAsync(cu_ptr_t *dsts, cu_ptr_t *srcs, size_t *sizes, size_t count,
                              const memcpy_attr_t *attrs, const size_t *attr_idxs,
                              size_t num_attrs, size_t *fail_idx, void *stream)
{
    const char *refuse = getenv("FAKE_CUDA_BATCH_REFUSE");
    size_t limit = (refuse != NULL) ? strtoul(refuse, NULL, 10) : SIZE_MAX;
    int res;

    __atomic_add_fetch(&batch_calls, 1, __ATOMIC_RELAXED);
    *fail_idx = SIZE_MAX;
    if ((stream == NULL) || (count == 0) || (num_attrs == 0) || (num_attrs > count) ||
        (attr_idxs[0] != 0)) {
        return INVALID_VALUE;
    }
    for (size_t k = 0; k < num_attrs; k++) {
        if (((k > 0) && (attr_idxs[k] <= attr_idxs[k - 1])) || (attr_idxs[k] >= count) ||
            (attrs[k].src_access_order < 1) || (attrs[k].src_access_order > 3)) {
            return INVALID_VALUE;
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (i >= limit) {
            *fail_idx = i;
            return NOT_SUPPORTED;
        }
        res = enqueue(stream, (void*)(uintptr_t)dsts[i], (const void*)(uintptr_t)srcs[i],
                      sizes[i]);
        if (res != SUCCESS) {
            *fail_idx = i;
            return res;
        }
    }
    return SUCCESS;
}

EXPORT int cuMemcpyHtoDAsync_v2(cu_ptr_t dst, const void *src, size_t len, void *stream)
{
    return enqueue(stream, (void*)(uintptr_t)dst, src, len);
}

EXPORT int cuMemcpyDtoHAsync_v2(void *dst, cu_ptr_t src, size_t len, void *stream)
{
    return enqueue(stream, dst, (const void*)(uintptr_t)src, len);
}

EXPORT int cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    if (current == NULL) {
        return INVALID_CONTEXT;
    }
    *stream = calloc(1, sizeof(stream_t));
    return (*stream != NULL) ? SUCCESS : INVALID_VALUE;
}

EXPORT int cuStreamSynchronize(void *stream)
{
    int res;

    pthread_mutex_lock(&lock);
    while (stream_step(stream)) {
    }
    res = ((stream_t*)stream)->error;
    pthread_mutex_unlock(&lock);
    return res;
}

EXPORT int cuStreamDestroy_v2(void *stream)
{
    cuStreamSynchronize(stream);
    free(stream);
    return SUCCESS;
}

EXPORT int cuEventCreate(void **event, unsigned flags)
{
    (void)flags;
    if (current == NULL) {
        return INVALID_CONTEXT;
    }
    *event = calloc(1, sizeof(event_t));
    return (*event != NULL) ? SUCCESS : INVALID_VALUE;
}

EXPORT int cuEventRecord(void *event, void *stream)
{
    event_t *e = event;

    if ((e == NULL) || (stream == NULL)) {
        return INVALID_HANDLE;
    }
    pthread_mutex_lock(&lock);
    e->stream = stream;
    e->seq    = e->stream->submitted;
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}

EXPORT int cuEventQuery(void *event)
{
    event_t *e = event;
    int res;

    if (current == NULL) {
        return INVALID_CONTEXT;
    }
    pthread_mutex_lock(&lock);
    if ((e->stream != NULL) && (e->stream->done < e->seq) && ((++query_count % 3) == 0)) {
        stream_step(e->stream);     /* the copy engine moves one copy per three looks */
    }
    res = ((e->stream == NULL) || (e->stream->done >= e->seq)) ? SUCCESS : NOT_READY;
    pthread_mutex_unlock(&lock);
    return res;
}

EXPORT int cuEventDestroy_v2(void *event)
{
    free(event);
    return SUCCESS;
}

EXPORT int cuIpcGetMemHandle(cu_ipc_handle_t *handle, cu_ptr_t ptr)
{
    ipc_handle_t h;
    alloc_t *a;

    memset(handle, 0, sizeof(*handle));
    pthread_mutex_lock(&lock);
    a = find((const void*)(uintptr_t)ptr);
    if ((a == NULL) || a->host || a->imported || (a->base != (char*)(uintptr_t)ptr)) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, "fakeipc", 8);
    h.pid       = (int)getpid();
    h.fd        = a->fd;
    h.size      = a->size;
    h.buffer_id = a->buffer_id;
    pthread_mutex_unlock(&lock);
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
    if (current == NULL) {
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
    pthread_mutex_lock(&lock);
    a = alloc_slot(h.size, 0, fd);
    if (a != NULL) {
        a->imported = 1;
        *ptr        = (uintptr_t)a->base;
    }
    pthread_mutex_unlock(&lock);
    if (a == NULL) {
        close(fd);
        return INVALID_VALUE;
    }
    return SUCCESS;
}

EXPORT int cuIpcCloseMemHandle(cu_ptr_t ptr)
{
    alloc_t *a;

    pthread_mutex_lock(&lock);
    a = find((const void*)(uintptr_t)ptr);
    if ((a == NULL) || !a->imported || (a->base != (char*)(uintptr_t)ptr)) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    alloc_release(a);
    pthread_mutex_unlock(&lock);
    return SUCCESS;
}
