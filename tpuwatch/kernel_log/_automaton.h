/* The keyword automaton of tpuwatch.kernel_log._keywords: its tables, how they are built and how a text is
 * scanned (_automaton.c); the Python type around it is in _keywords.c.
 *
 * An Aho-Corasick automaton: keywords are matched exactly, case-sensitively, as code points, in str objects of any
 * kind; finds may overlap.  It is a full transition table over the code points the keywords use (every other code
 * point is one class that leads back to the root), so a scan is one table step per character, and characters that
 * begin no keyword are skipped at the root without stepping (16 at a time in 1-byte text where the CPU can).
 */

#ifndef TPUWATCH_AUTOMATON_H
#define TPUWATCH_AUTOMATON_H

#include <Python.h>
#include <stdint.h>

typedef struct {
    Py_ssize_t start;
    int32_t keyword;
} Find;

typedef struct {
    Find *items;
    Py_ssize_t count, size;
} Finds;

typedef struct {
    PyObject_HEAD
    PyObject *keywords;   /* tuple of str, as given */
    Py_ssize_t *lengths;  /* each keyword's length in code points from its entry on (the part in the trie) */
    Py_ssize_t *entry;    /* each keyword's entry: the characters before it (its head) are compared before a find */
    Py_ssize_t *head_at;  /* each keyword's head in heads */
    Py_UCS4 *heads;       /* the heads, one after another */
    int32_t *same;        /* per keyword: the next keyword whose part ends at the same state, or -1 */
    uint16_t *delta;      /* states x width: the next state */
    int32_t *output;      /* per state: the first keyword whose part ends there, or -1 */
    int32_t *chain;       /* per state: the next state down its suffix links with an output, or -1 */
    uint8_t *reports;     /* per state: 1 if a keyword ends there or down its suffix links */
    Py_UCS4 *wide;        /* the keywords' code points >= 256, sorted; their classes follow the latin ones */
    Py_ssize_t n_wide, first_wide, width, states;
    uint16_t latin[256];  /* class of each code point < 256; 0: in no keyword */
    uint8_t starts[256];  /* 1 if a code point < 256 leaves the root */
    uint8_t nibbles[2][16]; /* the same, by nibble: c may leave it if nibbles[0][c & 15] & nibbles[1][c >> 4] */
    int ssse3;            /* 1 to use scan_ssse3(): this CPU has SSSE3, and TPUWATCH_KEYWORDS_SCALAR is not set */
} Automaton;

/* Builds the tables of a for keywords (a tuple of non-empty str) entered at entries (NULL, or a tuple of as many
 * offsets, one in each keyword: the automaton holds each keyword's part from there on and compares the characters
 * before it where that part is found, so that it leaves its root only at the characters the entries are; any
 * entries give the same finds): 0, or -1 with an exception set (ValueError when they are too many for one table,
 * or the entries wrong); the caller frees what was built either way. */
int tpuwatch_automaton_build(Automaton *a, PyObject *keywords, PyObject *entries);

/* Frees the tables (a stays safe to free again). */
void tpuwatch_automaton_free(Automaton *a);

/* Every keyword in text[start:end] (data and kind as PyUnicode_DATA and PyUnicode_KIND give them) into f, unsorted:
 * 0, or -1 when out of memory; with f NULL, 1 at the first find and 0 when there is none.  Needs no GIL. */
int tpuwatch_automaton_scan(const Automaton *a, int kind, const void *data, Py_ssize_t start, Py_ssize_t end,
                            Finds *f);

#endif
