/*
 * What gen_corpus.c and gen_corpus_shm.c share: the helpers that build the current seed and
 * write it out (gen_corpus.c holds the seed), and the shm ring's generator.
 */
#ifndef XFER_FUZZ_GEN_CORPUS_H
#define XFER_FUZZ_GEN_CORPUS_H

#include <stddef.h>

/* Reports what failed and exits. */
void gc_fail(const char *what);

/* Appends n bytes at p to the current seed. */
void gc_add(const void *p, size_t n);

/* Writes the current seed to DIR/harness/name and starts a new, empty one. */
void gc_save(const char *harness, const char *name);

/* Writes the shm_ring harness's seeds (gen_corpus_shm.c). */
void gc_gen_shm_ring(void);

#endif
