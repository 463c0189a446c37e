/*
 * The CUDA driver inside libxfer: which library to load (XFER_CUDA_LIB) and what a
 * registration of CUDA memory needs of it. The driver table itself and memory detection are
 * services of xfer/component.h.
 */
#ifndef XFER_CUDA_DRIVER_H
#define XFER_CUDA_DRIVER_H

#include <xfer/component.h>

/* The library the first load will open; a context sets it from XFER_CUDA_LIB. Once the driver
 * is loaded (or failed to load) the choice is made for the life of the process. */
void xfer_cuda_lib_set(const char *lib);

/* 1 when the driver library is mapped in this process (the application, or an earlier
 * load here, opened it); asked without loading it. */
int xfer_cuda_in_process(void);

/* Make synchronous memory operations on a CUDA allocation complete before they return
 * (CU_POINTER_ATTRIBUTE_SYNC_MEMOPS), so that what a NIC reads after a cuMemcpy is there.
 * Runs in the allocation's context and gives the caller's back. */
xfer_status_t xfer_cuda_sync_memops(const xfer_mem_attr_t *attr, char *why, size_t why_size);

#endif /* XFER_CUDA_DRIVER_H */
