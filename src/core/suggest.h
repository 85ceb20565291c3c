/* "Did you mean ...?": the known name nearest to a mistyped one, for error messages. */
#ifndef LOOM_CORE_SUGGEST_H
#define LOOM_CORE_SUGGEST_H

#include <stddef.h>

/* The candidate nearest to word by edit distance (insertions, deletions, substitutions and
 * swaps of neighbours each cost 1), or NULL when none is near: at most 1 edit for words of
 * up to 4 characters, 2 up to 8, 3 beyond; ties go to the earlier candidate. A leading
 * "--" or "-" on word is ignored, and a word the start of a candidate counts as near. */
const char *loom_suggest_nearest(const char *word, const char *const *candidates, int n);

/* Writes ": did you mean --NAME?" into out when loom_suggest_nearest finds one, else "". */
void loom_suggest_flag(char *out, size_t cap, const char *word, const char *const *candidates,
                       int n);

#endif
