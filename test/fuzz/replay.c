/*
 * Replays files through a fuzz harness without libFuzzer, so that every input that once
 * crashed stays a test on machines without clang. With arguments: each file, or each file of
 * each directory. Without: $XFERTEST_SRC_DIR/test/fuzz/corpus/FUZZ_NAME and
 * .../regressions/FUZZ_NAME (make check). Each input is copied into a buffer of exactly its
 * size, so that a sanitizer build sees a read past its end. The verdict is the harness's: a
 * crash, an abort from FUZZ_CHECK or a sanitizer report fails; finishing passes.
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#ifndef FUZZ_NAME
#error "FUZZ_NAME must name the harness"
#endif

static int replay_file(const char *path)
{
    struct stat st;
    uint8_t *buf;
    size_t got = 0;
    FILE *f;

    f = fopen(path, "rb");
    if ((f == NULL) || (fstat(fileno(f), &st) != 0)) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        if (f != NULL) {
            fclose(f);
        }
        return -1;
    }
    buf = malloc((st.st_size > 0) ? (size_t)st.st_size : 1);
    if (buf == NULL) {
        fclose(f);
        return -1;
    }
    if (st.st_size > 0) {
        got = fread(buf, 1, (size_t)st.st_size, f);
    }
    fclose(f);
    if (got != (size_t)st.st_size) {
        fprintf(stderr, "%s: short read\n", path);
        free(buf);
        return -1;
    }
    printf("%s: %zu bytes\n", path, got);
    fflush(stdout);
    LLVMFuzzerTestOneInput(buf, got);
    free(buf);
    return 1;
}

/* A file, or every regular file of a directory (in name order); returns how many ran, -1 on
 * an error, and 0 for a directory that does not exist when missing_ok. */
static int replay_path(const char *path, int missing_ok)
{
    struct dirent **names;
    struct stat st;
    int num, count = 0;

    if (stat(path, &st) != 0) {
        if (missing_ok && (errno == ENOENT)) {
            return 0;
        }
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        return replay_file(path);
    }
    num = scandir(path, &names, NULL, alphasort);
    if (num < 0) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    for (int i = 0; i < num; i++) {
        char file[4096];
        int ret = 0;

        snprintf(file, sizeof(file), "%s/%s", path, names[i]->d_name);
        if ((names[i]->d_name[0] != '.') && (stat(file, &st) == 0) && S_ISREG(st.st_mode)) {
            ret = replay_file(file);
        }
        free(names[i]);
        if (ret < 0) {
            count = -1;
        } else if (count >= 0) {
            count += ret;
        }
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    const char *src = getenv("XFERTEST_SRC_DIR");
    char corpus[4096], regressions[4096];
    int n_corpus, n_regress, total = 0;

    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            int n = replay_path(argv[i], 0);
            if (n < 0) {
                return 1;
            }
            total += n;
        }
        printf("%s: replayed %d input(s)\n", FUZZ_NAME, total);
        return 0;
    }
    if (src == NULL) {
        fprintf(stderr, "usage: %s FILE|DIR... (or set XFERTEST_SRC_DIR to the source tree)\n",
                argv[0]);
        return 1;
    }
    snprintf(corpus, sizeof(corpus), "%s/test/fuzz/corpus/%s", src, FUZZ_NAME);
    snprintf(regressions, sizeof(regressions), "%s/test/fuzz/regressions/%s", src, FUZZ_NAME);
    n_corpus  = replay_path(corpus, 0);
    n_regress = replay_path(regressions, 1);
    if ((n_corpus < 0) || (n_regress < 0)) {
        return 1;
    }
    if (n_corpus == 0) {
        fprintf(stderr, "%s: the corpus %s is empty\n", FUZZ_NAME, corpus);
        return 1;
    }
    printf("%s: replayed %d corpus and %d regression input(s)\n", FUZZ_NAME, n_corpus,
           n_regress);
    return 0;
}
