/* Small string helpers: suggestions for misspelled names, trimming, error accumulation. */
#include "xfer_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Levenshtein distance, case-insensitive; names here are short (< 64 chars). */
size_t xfer_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t row[65];

    if ((la > 64) || (lb > 64)) {
        return (size_t)-1;
    }
    for (size_t j = 0; j <= lb; j++) {
        row[j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0]      = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up   = row[j];
            size_t cost = (tolower((unsigned char)a[i - 1]) ==
                           tolower((unsigned char)b[j - 1])) ? 0 : 1;
            size_t best = diag + cost;
            if (row[j] + 1 < best) {
                best = row[j] + 1;
            }
            if (row[j - 1] + 1 < best) {
                best = row[j - 1] + 1;
            }
            row[j] = best;
            diag   = up;
        }
    }
    return row[lb];
}

/* The closest of names to word, or NULL when none is close enough to be a likely typo. */
const char *xfer_closest_name(const char *word, const char *const *names, size_t num)
{
    const char *best = NULL;
    size_t best_dist = (size_t)-1;
    size_t limit     = (strlen(word) <= 4) ? 2 : (strlen(word) / 3 + 1);

    for (size_t i = 0; i < num; i++) {
        size_t d = xfer_edit_distance(word, names[i]);
        if (d < best_dist) {
            best_dist = d;
            best      = names[i];
        }
    }
    return (best_dist <= limit) ? best : NULL;
}

char *xfer_strtrim(char *s)
{
    char *end;

    while (isspace((unsigned char)*s)) {
        s++;
    }
    end = s + strlen(s);
    while ((end > s) && isspace((unsigned char)end[-1])) {
        *--end = '\0';
    }
    return s;
}

void xfer_str_upper(char *dst, const char *src, size_t size)
{
    size_t i;

    for (i = 0; (i + 1 < size) && (src[i] != '\0'); i++) {
        dst[i] = (char)toupper((unsigned char)src[i]);
    }
    if (size > 0) {
        dst[i] = '\0';
    }
}

char *xfer_strdup_printf(const char *fmt, ...)
{
    va_list ap;
    char *str;
    int ret;

    va_start(ap, fmt);
    ret = vasprintf(&str, fmt, ap);
    va_end(ap);
    return (ret < 0) ? NULL : str;
}

void xfer_errors_append(char **text_p, const char *fmt, ...)
{
    char *line, *joined;
    va_list ap;
    int ret;

    va_start(ap, fmt);
    ret = vasprintf(&line, fmt, ap);
    va_end(ap);
    if (ret < 0) {
        return;
    }
    if (*text_p == NULL) {
        *text_p = line;
        return;
    }
    if (asprintf(&joined, "%s\n%s", *text_p, line) >= 0) {
        free(*text_p);
        *text_p = joined;
    }
    free(line);
}

long xfer_file_long(const char *path, long dflt)
{
    FILE *f = fopen(path, "r");
    long value;

    if (f == NULL) {
        return dflt;
    }
    if (fscanf(f, "%li", &value) != 1) {
        value = dflt;
    }
    fclose(f);
    return value;
}
