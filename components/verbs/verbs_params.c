/*
 * What the verbs parameters' enumerations accept (verbs_params.h) and what XFER_VERBS_MR_CACHE
 * allows: shared by every component built on the verbs code.
 */
#include "config.h"

#include "verbs.h"
#include "verbs_params.h"

const char *const xfer_verbs_mtu_values[] = {"auto", "256", "512", "1024", "2048", "4096",
                                             NULL};
const char *const xfer_verbs_mr_cache_values[] = {"auto", "off", NULL};

int xfer_verbs_mr_cache_allowed(const xfer_verbs_config_t *cfg, char *why, size_t why_size)
{
    if (cfg->mr_cache == XFER_VERBS_MR_CACHE_OFF) {
        xfer_reason_set(why, why_size, "XFER_VERBS_MR_CACHE=off");
        return 0;
    }
    if (cfg->mrc_max_entries == 0) {
        xfer_reason_set(why, why_size, "XFER_VERBS_MR_CACHE_MAX_ENTRIES=0");
        return 0;
    }
    return xfer_unmapq_complete(why, why_size);
}
