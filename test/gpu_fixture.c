/*
 * A CUDA device for the suites: see gpu_fixture.h.
 */
#include "gpu_fixture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
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

uint64_t tg_transport_caps(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    const char *name = xfer_endpoint_transport(ep);
    xfer_component_info_t info;

    for (size_t i = 0; i < xfer_component_count(ctx); i++) {
        if ((xfer_component_get(ctx, i, &info) == XFER_OK) && (info.attr != NULL) &&
            (strcmp(info.name, name) == 0)) {
            return info.attr->caps;
        }
    }
    return 0;
}

int tg_transport_moves_cuda(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    return (tg_transport_caps(ctx, ep) & XFER_CAP_MEM_CUDA) != 0;
}

void tg_use_stand_in_driver(void)
{
    const char *dir = getenv("XFERTEST_PLUGIN_DIR");
    char path[4096];

    cr_assert_not_null(dir, "XFERTEST_PLUGIN_DIR is not set");
    snprintf(path, sizeof(path), "%s/fakecuda.so", dir);
    setenv("XFER_CUDA_LIB", path, 1);
}
