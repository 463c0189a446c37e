/*
 * Memory shared with a peer on this host: the peer's memfds that this side maps (its ring
 * segments, and memory it allocated with xfer_mem_alloc()).
 *
 * A mapping of a file whose owner can still shrink it is a fault waiting to happen: a load or
 * store past its new end raises SIGBUS in the process that maps it. So every memfd offered to
 * a peer is sealed against shrinking and growing before its descriptor is handed out
 * (xfer_memfd_sealed(), the framework's, for the rings and for xfer_mem_alloc()), and a
 * peer's memfd is only mapped once it shows that seal and is large enough for the range. The
 * peer's descriptor is opened through /proc/<pid>/fd/<n>, which the kernel allows with the
 * rights ptrace would need; the inode number that came with the descriptor number must match,
 * so a number the peer has since closed and reused for another file is refused.
 *
 * A rendezvous message from memory the sender allocated with xfer_mem_alloc() names that
 * memory's memfd; the receiver maps the sender's whole registered range once, read only, and
 * copies this and later messages from it with memcpy instead of process_vm_readv. Each
 * endpoint keeps up to XFER_SHM_PEER_MAPS such ranges (the least recently used one gives way),
 * and remembers a range that failed the checks so that it is not tried again; after
 * XFER_SHM_PEER_MAPS failures it stops trying for that peer, so that a peer naming ever new
 * files costs neither a system call nor a log line per message. A range the
 * sender has freed stays mapped here until it gives way: its pages are orphaned, never
 * memory the sender uses for something else. A receiver that shares the copy of a large
 * message (shm_coop.c) names its receive buffer's memfd the same way; the sender maps that
 * range for writing, in the same cache.
 */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t xfer_shm_fd_ino(int fd)
{
    struct stat st;

    return (fstat(fd, &st) == 0) ? (uint64_t)st.st_ino : 0;
}

xfer_status_t xfer_shm_peer_map(const xfer_shm_peer_fd_t *pf, xfer_shm_map_t *map, char *why,
                                size_t why_size)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start, end;
    struct stat st;
    char path[64];
    void *base;
    int fd, seals;

    if ((pf->length == 0) || (pf->offset > UINT64_MAX - pf->length) ||
        (pf->offset + pf->length > (uint64_t)INT64_MAX - page)) {
        snprintf(why, why_size, "a range of %llu bytes at offset %llu of the peer's memfd",
                 (unsigned long long)pf->length, (unsigned long long)pf->offset);
        return XFER_ERR_PROTOCOL;
    }
    snprintf(path, sizeof(path), "/proc/%d/fd/%u", (int)pf->pid, pf->fd);
    fd = open(path, (pf->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;

        snprintf(why, why_size, "cannot open the peer's memfd %s: %s%s", path, strerror(err),
                 ((err == EACCES) || (err == EPERM)) ? " (the kernel does not let this "
                 "process read the peer's descriptors)" : (err == ENOENT) ? " (the peer "
                 "closed it, or exited)" : "");
        return (err == ENOENT) ? XFER_ERR_CONNECTION : XFER_ERR_UNAVAILABLE;
    }
    seals = fcntl(fd, F_GET_SEALS);
    if ((fstat(fd, &st) != 0) || !S_ISREG(st.st_mode)) {
        snprintf(why, why_size, "the peer's descriptor %s is not a memory file", path);
        goto err_protocol;
    }
    if ((pf->ino != 0) && ((uint64_t)st.st_ino != pf->ino)) {
        snprintf(why, why_size, "the peer's descriptor %s is another file now (inode %llu, "
                 "%llu expected): the memory it named is gone", path,
                 (unsigned long long)st.st_ino, (unsigned long long)pf->ino);
        goto err_protocol;
    }
    if ((seals < 0) || ((seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) !=
                        (F_SEAL_SHRINK | F_SEAL_SEAL))) {
        snprintf(why, why_size, "the peer's memfd %s is not sealed against shrinking (seals "
                 "0x%x): mapping it would let the peer fault this process", path, seals);
        goto err_protocol;
    }
    if ((pf->exact && ((uint64_t)st.st_size != pf->offset + pf->length)) ||
        ((uint64_t)st.st_size < pf->offset + pf->length)) {
        snprintf(why, why_size, "the peer's memfd %s has %lld bytes; %llu at offset %llu "
                 "were announced", path, (long long)st.st_size,
                 (unsigned long long)pf->length, (unsigned long long)pf->offset);
        goto err_protocol;
    }
    start = pf->offset / page * page;
    end   = (pf->offset + pf->length + page - 1) / page * page;
    base  = mmap(NULL, end - start, pf->read_only ? PROT_READ : (PROT_READ | PROT_WRITE),
                 MAP_SHARED, fd, (off_t)start);
    close(fd);
    if (base == MAP_FAILED) {
        snprintf(why, why_size, "cannot map %llu bytes of the peer's memfd: %s",
                 (unsigned long long)(end - start), strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    map->base     = base;
    map->map_len  = end - start;
    map->data     = (uint8_t*)base + (pf->offset - start);
    return XFER_OK;

err_protocol:
    close(fd);
    return XFER_ERR_PROTOCOL;
}

void xfer_shm_peer_unmap(xfer_shm_map_t *map)
{
    if (map->base != NULL) {
        munmap(map->base, map->map_len);
    }
    map->base    = NULL;
    map->data    = NULL;
    map->map_len = 0;
}

/* The cache entry for m's range: the one that holds it, else a free one, else the least
 * recently used (unmapped first). */
static xfer_shm_peer_mem_t *peer_mem_entry(xfer_ep_h ep, const xfer_shm_rndv_mem_t *m,
                                           int writable, int *found)
{
    xfer_shm_peer_mem_t *victim = &ep->peer_mem[0];

    for (size_t i = 0; i < XFER_SHM_PEER_MAPS; i++) {
        xfer_shm_peer_mem_t *e = &ep->peer_mem[i];

        if ((e->used != 0) && (e->fd == m->fd) && (e->ino == m->ino) &&
            (e->offset == m->offset) && (e->length == m->length) &&
            (e->writable == writable)) {
            *found = 1;
            return e;
        }
        if (e->used < victim->used) {
            victim = e;
        }
    }
    *found = 0;
    xfer_shm_peer_unmap(&victim->map);
    memset(victim, 0, sizeof(*victim));
    return victim;
}

uint8_t *xfer_shm_peer_mem(xfer_ep_h ep, const xfer_shm_rndv_mem_t *m, int writable)
{
    xfer_shm_peer_fd_t pf = {0};
    char why[XFER_REASON_MAX];
    xfer_shm_peer_mem_t *e;
    xfer_status_t status;
    int found;

    if (!ep->iface->cfg->map || (ep->peer_mem_refused >= XFER_SHM_PEER_MAPS)) {
        return NULL;
    }
    e       = peer_mem_entry(ep, m, writable, &found);
    e->used = ++ep->peer_mem_clock;
    if (!found) {
        e->fd        = m->fd;
        e->ino       = m->ino;
        e->offset    = m->offset;
        e->length    = m->length;
        e->writable  = writable;
        pf.pid       = ep->peer_pid;
        pf.fd        = m->fd;
        pf.ino       = m->ino;
        pf.offset    = m->offset;
        pf.length    = m->length;
        pf.read_only = !writable;
        status       = xfer_shm_peer_map(&pf, &e->map, why, sizeof(why));
        if (status != XFER_OK) {
            xfer_log((status == XFER_ERR_PROTOCOL) ? XFER_LOG_WARN : XFER_LOG_INFO,
                     XFER_SHM_SUBSYS, "%llu bytes of pid %d's memfd %u do not map for %s: %s",
                     (unsigned long long)m->length, (int)ep->peer_pid, m->fd, writable ?
                     "writing (the receiver copies messages into them alone)" :
                     "reading (messages from them are read by CMA)", why);
            e->refused = 1;
            if (++ep->peer_mem_refused == XFER_SHM_PEER_MAPS) {
                xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "%u ranges of pid %d's memory did not "
                         "map: its memory is not mapped from now on, without trying (messages "
                         "are read by CMA)",
                         XFER_SHM_PEER_MAPS, (int)ep->peer_pid);
            }
        } else {
            xfer_log(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "mapped %llu bytes of pid %d's memfd "
                     "%u%s: messages %s them are a memcpy here", (unsigned long long)m->length,
                     (int)ep->peer_pid, m->fd, writable ? " for writing" : "",
                     writable ? "into" : "from");
        }
    }
    return e->refused ? NULL : e->map.data + m->msg_offset;
}

void xfer_shm_peer_mem_release(xfer_ep_h ep)
{
    for (size_t i = 0; i < XFER_SHM_PEER_MAPS; i++) {
        xfer_shm_peer_unmap(&ep->peer_mem[i].map);
        ep->peer_mem[i].used = 0;
    }
}
