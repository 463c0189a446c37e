/*
 * What a test's child on the shm transport does to the rings it maps (shm_child.h).
 */
#include "shm_child.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A child's: the bases of the two shm rings it maps (its own and its peer's), found in
 * /proc/self/maps. */
void shm_rings_mapped(uint8_t *bases[2])
{
    char line[512];
    FILE *maps = fopen("/proc/self/maps", "r");
    int n      = 0;

    TP_CHECK(maps != NULL, "maps");
    while (fgets(line, sizeof(line), maps) != NULL) {
        unsigned long lo, hi;

        if ((strstr(line, "memfd:xfer-shm") != NULL) &&
            (sscanf(line, "%lx-%lx", &lo, &hi) == 2) && (n++ < 2)) {
            bases[n - 1] = (uint8_t*)lo;
        }
    }
    fclose(maps);
    TP_CHECK(n == 2, "found %d shm rings in the child, expected 2", n);
}

/* A child's: tell the parent it is ready (1), then wait to be killed. */
int ready_then_stall(tp_side_t *s)
{
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    pause();
    return 0;
}
