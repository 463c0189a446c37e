/*
 * How the cuda_batch suite's batches reach the CUDA driver (test_cuda_batch.c holds the
 * suite, its setup and the helpers test_cuda_batch.h declares): over shm, batches between
 * device memory on both sides go by shm's copy kernel, a table a launch, and the others by
 * cuMemcpyBatchAsync, 256 copies a call (both counted by the stand-in); a kernel the driver
 * cannot load, or one that copies wrong, or a peer on another GPU, leaves the batches to the
 * driver's copies, and a batch call the driver refuses half-way lands copy by copy.
 *
 * All run over test/plugins/fake_cuda.c, the stand-in for the driver, which counts its calls
 * and produces these faults on demand, as no GPU here can.
 */
#include "test_cuda_batch.h"
#include "cuda_peer.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A count the stand-in keeps of this process's calls (fake_cuda_batch_calls: of
 * cuMemcpyBatchAsync, fake_cuda_kernel_launches: of its copy kernel). */
static unsigned long stand_in_count(const char *name)
{
    unsigned long (*count)(void);
    char path[4096];
    unsigned long n;
    void *h, *sym;

    snprintf(path, sizeof(path), "%s/fakecuda.so", getenv("XFERTEST_PLUGIN_DIR"));
    h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(h, "the stand-in driver is not loaded in this process");
    sym = dlsym(h, name);
    cr_assert_not_null(sym, "%s", name);
    memcpy(&count, &sym, sizeof(count));
    n = count();
    dlclose(h);
    return n;
}

static int over_shm(dev_test_t *t)
{
    return strcmp(xfer_endpoint_transport(t->peer.ep), "shm") == 0;
}

/* Without the copy kernel (XFER_SHM_CUDA_GATHER=n) a batch's copies go to the driver by
 * cuMemcpyBatchAsync over shm, 256 a call: rounds of 128, 37 and 600 blocks are 1 + 1 + 3
 * calls; tcp moves device memory through its bounce buffers and calls it never. */
static void batched_calls(const char *refuse, unsigned long shm_calls)
{
    dev_test_t t;

    tg_use_stand_in_driver();
    setenv("XFER_SHM_CUDA_GATHER", "n", 1);
    if (refuse != NULL) {
        setenv("FAKE_CUDA_BATCH_REFUSE", refuse, 1);
    }
    tcb_start(&t);
    tcb_put_rounds(&t);
    cr_expect_eq(stand_in_count("fake_cuda_batch_calls"), over_shm(&t) ? shm_calls : 0,
                 "cuMemcpyBatchAsync calls over %s", xfer_endpoint_transport(t.peer.ep));
    cr_expect_eq(stand_in_count("fake_cuda_kernel_launches"), 0);
    dt_finish(&t);
}

Test(cuda_batch, a_batch_hands_the_driver_its_copies_256_a_call_stand_in)
{
    batched_calls(NULL, 5);
}

/* A driver that takes the first 100 copies of a call and then refuses the call: the batch
 * lands whole (the peer checks it at the notification), its copies one by one, and the
 * iface asks the driver no more batches. */
Test(cuda_batch, a_batch_call_the_driver_refuses_lands_copy_by_copy_stand_in)
{
    batched_calls("100", 1);
}

/* Over shm, device memory here to and from the peer's goes by the copy kernel (checked once
 * at its load by a launch of its own): one launch per
 * table of XFER_SHM_CUDA_GATHER_DESCS entries (16 here), a block of more than 64 KiB spread
 * over entries of at most that, and a batch that needs more than a table waits for each
 * before refilling it (the stand-in reads the table when the launch runs, so an entry
 * overwritten before that moves the wrong block). The peer checks each put batch at its
 * notification; a get batch is checked here. No driver copy is asked for. */
Test(cuda_batch, device_to_device_batches_go_by_the_copy_kernel_a_table_a_launch_stand_in)
{
    static const uint64_t big[] = {300000, 5, 700000};      /* 5 + 1 + 11 entries */
    uint64_t lens[MAX_DESCS];
    unsigned long launches = 0;
    char *img = malloc(DT_MAXLEN);
    dev_test_t t;
    blocks_t b;

    cr_assert_not_null(img);
    tg_use_stand_in_driver();
    setenv("XFER_SHM_CUDA_GATHER_DESCS", "16", 1);
    tcb_start(&t);
    for (unsigned round = 0; round < 3; round++) {
        size_t n = tcb_lens_of(round, lens);

        tcb_blocks_make(&b, lens, n);
        tcb_local_image(&b, 930 + round, t.host);
        cr_assert_eq(t.gpu.drv->memcpy_htod(t.src, t.host, b.total), 0);
        tcb_put_round(&t, &b, t.src_mem, 930 + round);
        tp_send(&t.peer, CMD_FILL);
        tp_send(&t.peer, 940 + round);
        cr_assert_eq(tp_recv(&t.peer), 1);
        tcb_get_round(&t, &b, 940 + round, img);
        launches += 2 * ((n + 15) / 16);        /* no block of these rounds exceeds 64 KiB */
    }
    tcb_blocks_make(&b, big, 3);
    tcb_local_image(&b, 935, t.host);
    cr_assert_eq(t.gpu.drv->memcpy_htod(t.src, t.host, b.total), 0);
    tcb_put_round(&t, &b, t.src_mem, 935);
    launches += 2 + 1;                          /* and the kernel's check at its load */
    cr_expect_eq(stand_in_count("fake_cuda_kernel_launches"), over_shm(&t) ? launches : 0,
                 "copy kernel launches over %s", xfer_endpoint_transport(t.peer.ep));
    cr_expect_eq(stand_in_count("fake_cuda_batch_calls"), 0);
    free(img);
    dt_finish(&t);
}

/* A driver that cannot load the kernel's PTX (older than its ISA): batches go by the
 * driver's copies and land the same. */
Test(cuda_batch, a_kernel_the_driver_cannot_load_leaves_batches_to_copies_stand_in)
{
    dev_test_t t;

    tg_use_stand_in_driver();
    setenv("FAKE_CUDA_MODULE_REFUSE", "1", 1);
    tcb_start(&t);
    tcb_put_rounds(&t);
    cr_expect_eq(stand_in_count("fake_cuda_kernel_launches"), 0);
    cr_expect_eq(stand_in_count("fake_cuda_batch_calls"), over_shm(&t) ? 5 : 0);
    dt_finish(&t);
}

/* A kernel that copies wrong (as a driver that compiled its PTX wrong would run it) is
 * caught by the check at its load, before it moved anyone's data: batches go by copies and
 * land whole. */
Test(cuda_batch, a_copy_kernel_that_copies_wrong_is_not_used_stand_in)
{
    dev_test_t t;

    tg_use_stand_in_driver();
    setenv("FAKE_CUDA_GATHER_WRONG", "1", 1);
    tcb_start(&t);
    tcb_put_rounds(&t);
    cr_expect_eq(stand_in_count("fake_cuda_kernel_launches"), over_shm(&t) ? 1 : 0,
                 "the check's launch alone");
    cr_expect_eq(stand_in_count("fake_cuda_batch_calls"), over_shm(&t) ? 5 : 0);
    dt_finish(&t);
}

/* A peer whose memory is on another GPU (the stand-in's bus id, the peer's alone): the
 * kernel here could reach it only with peer access, so the batches go by the driver's
 * copies. */
Test(cuda_batch, a_peer_on_another_gpu_gets_batches_by_copies_stand_in)
{
    dev_test_t t;

    tg_use_stand_in_driver();
    dt_peer_env("FAKE_CUDA_PCI_BUS_ID", "0000:41:00.0");
    tcb_start(&t);
    tcb_put_rounds(&t);
    cr_expect_eq(stand_in_count("fake_cuda_kernel_launches"), 0);
    cr_expect_eq(stand_in_count("fake_cuda_batch_calls"), over_shm(&t) ? 5 : 0);
    dt_finish(&t);
}
