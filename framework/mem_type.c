/*
 * What kind of memory a range is: host or CUDA device memory. Asking must not initialise CUDA
 * in a process that does not use it, so the cheap facts come first: when the driver library is
 * not loaded in the process, or loaded but not initialised (every driver call then answers
 * CUDA_ERROR_NOT_INITIALIZED), no device memory exists and the range is host memory. Only a
 * process that initialised CUDA pays for cuPointerGetAttributes, asked about the first and the
 * last byte so that the whole range is one kind of memory and, for device memory, in one
 * allocation.
 */
#include "xfer_int.h"
#include "cuda_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Driver constants used here (cuda.h is not needed to build libxfer). */
#define CU_SUCCESS                          0
#define CU_ERROR_NOT_INITIALIZED            3
#define CU_ERROR_DEINITIALIZED              4
#define CU_POINTER_ATTRIBUTE_CONTEXT        1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE    2
#define CU_POINTER_ATTRIBUTE_BUFFER_ID      7
#define CU_POINTER_ATTRIBUTE_IS_MANAGED     8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_HOST                  1
#define CU_MEMORYTYPE_DEVICE                2

/* What the driver says about one address. */
typedef struct ptr_info {
    int                known;       /* 0: CUDA is not initialised, nothing is device memory */
    unsigned           mem_type;    /* CU_MEMORYTYPE_*, 0 for memory CUDA does not know */
    int                managed;
    int                device;
    void               *context;
    unsigned long long buffer_id;
} ptr_info_t;

static xfer_status_t ptr_query(const xfer_cuda_driver_t *drv, const void *p, ptr_info_t *info,
                               char *why, size_t why_size)
{
    int attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT,
                   CU_POINTER_ATTRIBUTE_BUFFER_ID};
    void *data[] = {&info->mem_type, &info->managed, &info->device, &info->context,
                    &info->buffer_id};
    char res_str[160];
    int res;

    memset(info, 0, sizeof(*info));
    info->device = -1;
    res = drv->pointer_get_attributes(sizeof(attrs) / sizeof(attrs[0]), attrs, data,
                                      (xfer_cu_ptr_t)(uintptr_t)p);
    if ((res == CU_ERROR_NOT_INITIALIZED) || (res == CU_ERROR_DEINITIALIZED)) {
        memset(info, 0, sizeof(*info));
        info->device = -1;
        return XFER_OK;
    }
    if (res != CU_SUCCESS) {
        xfer_reason_set(why, why_size, "cuPointerGetAttributes(%p) failed: %s", p,
                        xfer_cuda_result_string(res, res_str, sizeof(res_str)));
        return XFER_ERR_IO;
    }
    info->known = 1;
    return XFER_OK;
}

static int ptr_is_device(const ptr_info_t *info)
{
    /* Managed memory is CPU-addressable: it is host memory to a transport. */
    return info->known && (info->mem_type == CU_MEMORYTYPE_DEVICE) && !info->managed;
}

static const char *ptr_host_how(const ptr_info_t *info)
{
    if (!info->known) {
        return "CUDA is not initialised in this process";
    } else if (info->managed) {
        return "CUDA managed memory, CPU-addressable";
    } else if (info->mem_type == CU_MEMORYTYPE_HOST) {
        return "CUDA pinned host memory";
    }
    return "the CUDA driver knows no allocation there";
}

xfer_status_t xfer_mem_detect(const void *addr, size_t length, xfer_mem_attr_t *attr_p,
                              char *why, size_t why_size)
{
    const xfer_cuda_driver_t *drv;
    xfer_mem_attr_t attr;
    ptr_info_t first, last;
    const char *last_byte;
    xfer_cu_ptr_t base = 0;
    size_t size        = 0;
    char res_str[160];
    xfer_status_t status;
    int res;

    if ((addr == NULL) || (length == 0) || (attr_p == NULL) ||
        ((uintptr_t)addr + length - 1 < (uintptr_t)addr)) {
        xfer_reason_set(why, why_size, "xfer_mem_detect: %s",
                        (attr_p == NULL) ? "NULL argument" : "empty or wrapping range");
        return XFER_ERR_INVALID_PARAM;
    }
    memset(&attr, 0, sizeof(attr));
    attr.type        = XFER_MEM_HOST;
    attr.cuda_device = -1;
    if (!xfer_cuda_in_process()) {
        xfer_reason_set(attr.how, sizeof(attr.how), "the CUDA driver is not loaded in this "
                        "process");
        goto out;
    }
    drv = xfer_cuda_driver(NULL, 0);
    if (drv == NULL) {
        xfer_reason_set(attr.how, sizeof(attr.how), "the CUDA driver in this process is not "
                        "usable");
        goto out;
    }
    last_byte = (const char*)addr + length - 1;
    status    = ptr_query(drv, addr, &first, why, why_size);
    if (status == XFER_OK) {
        status = ptr_query(drv, last_byte, &last, why, why_size);
    }
    if (status != XFER_OK) {
        return status;
    }
    if (ptr_is_device(&first) != ptr_is_device(&last)) {
        xfer_reason_set(why, why_size, "[%p, %p] starts in %s and ends in %s memory", addr,
                        (const void*)last_byte, ptr_is_device(&first) ? "CUDA device" : "host",
                        ptr_is_device(&last) ? "CUDA device" : "host");
        return XFER_ERR_INVALID_PARAM;
    }
    if (!ptr_is_device(&first)) {
        xfer_reason_set(attr.how, sizeof(attr.how), "%s", ptr_host_how(&first));
        goto out;
    }
    res = drv->mem_get_address_range(&base, &size, (xfer_cu_ptr_t)(uintptr_t)addr);
    if (res != CU_SUCCESS) {
        xfer_reason_set(why, why_size, "cuMemGetAddressRange(%p) failed: %s", addr,
                        xfer_cuda_result_string(res, res_str, sizeof(res_str)));
        return XFER_ERR_IO;
    }
    if ((first.buffer_id != last.buffer_id) ||
        ((uintptr_t)last_byte - base >= size)) {
        xfer_reason_set(why, why_size, "[%p, %p] runs past the end of its CUDA allocation "
                        "[0x%llx, +%zu) on device %d", addr, (const void*)last_byte,
                        (unsigned long long)base, size, first.device);
        return XFER_ERR_INVALID_PARAM;
    }
    attr.type           = XFER_MEM_CUDA;
    attr.cuda_device    = first.device;
    attr.cuda_context   = first.context;
    attr.cuda_buffer_id = first.buffer_id;
    attr.alloc_base     = base;
    attr.alloc_length   = size;
    xfer_reason_set(attr.how, sizeof(attr.how), "CUDA device memory on device %d, buffer id "
                    "%llu", first.device, (unsigned long long)first.buffer_id);
out:
    *attr_p = attr;
    return XFER_OK;
}
