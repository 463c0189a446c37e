/*
 * A CUDA device for the suites: see gpu_fixture.h.
 */
#include "gpu_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

void tg_gpu_open(tg_gpu_t *g, const char *suite)
{
    char why[XFER_REASON_MAX];
    int count = 0;

    memset(g, 0, sizeof(*g));
    if (xfer_cuda_init(why, sizeof(why)) != XFER_OK) {
        fprintf(stderr, "%s: skipped: %s\n", suite, why);
        cr_skip_test("%s", why);
    }
    g->drv = xfer_cuda_driver(why, sizeof(why));
    cr_assert_not_null(g->drv, "%s", why);
    if ((g->drv->device_get_count(&count) != 0) || (count == 0)) {
        fprintf(stderr, "%s: skipped: no CUDA device\n", suite);
        cr_skip_test("no CUDA device");
    }
    cr_assert_eq(g->drv->device_get(&g->device, 0), 0);
    cr_assert_eq(g->drv->device_primary_ctx_retain(&g->cu_ctx, g->device), 0);
    cr_assert_eq(g->drv->ctx_set_current(g->cu_ctx), 0);
}
