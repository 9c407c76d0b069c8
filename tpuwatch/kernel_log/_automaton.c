/* The keyword automaton: building its tables and scanning a text with them (see _automaton.h). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_automaton.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SCAN_SSSE3 1
#endif

#define MAX_KEYWORD_CHARS (1 << 24) /* all keywords together */
#define MAX_CLASSES 4096            /* distinct code points in the keywords, plus one */
#define MAX_CELLS (1 << 23)         /* states x classes of the table (16 MiB): beyond, the caller takes its regex */
#define NONE 0xFFFF                 /* no state: a table cell not filled in yet; so at most 65535 states */

static int
class_of(const Automaton *a, Py_UCS4 c)
{
    if (c < 256)
        return a->latin[c];
    Py_ssize_t lo = 0, hi = a->n_wide;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (a->wide[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < a->n_wide && a->wide[lo] == c) ? (int)(a->first_wide + lo) : 0;
}

static int
finds_push(Finds *f, Py_ssize_t start, int32_t keyword)
{
    if (f->count == f->size) {
        Py_ssize_t size = f->size ? 2 * f->size : 64;
        Find *items = PyMem_RawRealloc(f->items, (size_t)size * sizeof(Find));
        if (items == NULL)
            return -1;
        f->items = items;
        f->size = size;
    }
    f->items[f->count].start = start;
    f->items[f->count].keyword = keyword;
    f->count++;
    return 0;
}

/* 1 if keyword k's head (the characters before its entry) is in the text just before text[at], from text[lo] on. */
static int
head_before(const Automaton *a, int32_t k, int kind, const void *data, Py_ssize_t at, Py_ssize_t lo)
{
    const Py_ssize_t count = a->entry[k];
    if (at - count < lo)
        return 0;
    const Py_UCS4 *head = a->heads + a->head_at[k];
    for (Py_ssize_t j = 0; j < count; j++)
        if (PyUnicode_READ(kind, data, at - count + j) != head[j])
            return 0;
    return 1;
}

/* Every keyword whose part from its entry on ends at state s, the text's position end being just past it, and
 * whose head is before it (from text[lo] on), appended to f: how many, or -1 when out of memory; with f NULL, 1 at
 * the first and 0 when there is none. */
static Py_ssize_t
report(const Automaton *a, Py_ssize_t s, Py_ssize_t end, int kind, const void *data, Py_ssize_t lo, Finds *f)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t o = a->output[s] >= 0 ? s : a->chain[s]; o >= 0; o = a->chain[o])
        for (int32_t k = a->output[o]; k >= 0; k = a->same[k]) {
            Py_ssize_t at = end - a->lengths[k];
            if (a->entry[k] && !head_before(a, k, kind, data, at, lo))
                continue;
            if (f == NULL)
                return 1;
            if (finds_push(f, at - a->entry[k], k) < 0)
                return -1;
            count++;
        }
    return count;
}

/* The scan of text[start:end]: every find into f, 0 when done, -1 when out of memory; with f NULL, 1 at the first
 * find and 0 when there is none.  At the root, NEXT_START moves i to the next character that may leave it (or to
 * end); a character that cannot leaves the root for the root, so NEXT_START may stop early but never late. */
#define SCAN(TYPE, NEXT_START)                                                      \
    {                                                                               \
        const TYPE *text = (const TYPE *)data;                                      \
        for (Py_ssize_t i = start; i < end;) {                                      \
            if (s == 0) {                                                           \
                NEXT_START                                                          \
                if (i == end)                                                       \
                    break;                                                          \
            }                                                                       \
            Py_UCS4 c = text[i++];                                                  \
            s = a->delta[s * width + (c < 256 ? a->latin[c] : class_of(a, c))];    \
            if (a->reports[s]) {                                                    \
                Py_ssize_t reported = report(a, s, i, kind, data, start, f);        \
                if (reported < 0)                                                   \
                    return -1;                                                      \
                if (reported > 0 && f == NULL)                                      \
                    return 1;                                                       \
            }                                                                       \
        }                                                                           \
    }

/* One character at a time. */
#define NEXT_START_EACH                                                             \
    while (i < end && (text[i] > 255 ? class_of(a, text[i]) == 0 : !a->starts[text[i]])) \
        i++;

#ifdef SCAN_SSSE3
/* Sixteen characters at a time (1-byte text): ``mask`` holds a bit for each of text[block:block + 16] that may
 * leave the root, from two table lookups (PSHUFB) by nibble; a position past it computes the next one. */
#define NEXT_START_SSSE3                                                            \
    for (;;) {                                                                      \
        Py_ssize_t offset = i - block;                                              \
        if (offset < 16) {                                                          \
            unsigned rest = mask >> offset;                                         \
            if (rest) {                                                             \
                i += __builtin_ctz(rest);                                           \
                break;                                                              \
            }                                                                       \
            i = block + 16;                                                         \
        }                                                                           \
        if (end - i < 16) {                                                         \
            while (i < end && !a->starts[text[i]])                                  \
                i++;                                                                \
            break;                                                                  \
        }                                                                           \
        __m128i x = _mm_loadu_si128((const __m128i *)(text + i));                  \
        __m128i hit = _mm_and_si128(_mm_shuffle_epi8(low, _mm_and_si128(x, nibble)), \
                                    _mm_shuffle_epi8(high, _mm_and_si128(_mm_srli_epi16(x, 4), nibble))); \
        mask = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(hit, _mm_setzero_si128())) & 0xFFFFu; \
        block = i;                                                                  \
    }

__attribute__((target("ssse3"))) static int
scan_ssse3(const Automaton *a, const void *data, Py_ssize_t start, Py_ssize_t end, Finds *f)
{
    Py_ssize_t s = 0, block = start - 16;
    unsigned mask = 0;
    const int kind = PyUnicode_1BYTE_KIND;
    const Py_ssize_t width = a->width;
    const __m128i low = _mm_loadu_si128((const __m128i *)a->nibbles[0]);
    const __m128i high = _mm_loadu_si128((const __m128i *)a->nibbles[1]);
    const __m128i nibble = _mm_set1_epi8(0x0f);
    SCAN(Py_UCS1, NEXT_START_SSSE3)
    return 0;
}
#endif

int
tpuwatch_automaton_scan(const Automaton *a, int kind, const void *data, Py_ssize_t start, Py_ssize_t end, Finds *f)
{
    Py_ssize_t s = 0;
    const Py_ssize_t width = a->width;
#ifdef SCAN_SSSE3
    if (kind == PyUnicode_1BYTE_KIND && a->ssse3)
        return scan_ssse3(a, data, start, end, f);
#endif
    if (kind == PyUnicode_1BYTE_KIND)
        SCAN(Py_UCS1, NEXT_START_EACH)
    else if (kind == PyUnicode_2BYTE_KIND)
        SCAN(Py_UCS2, NEXT_START_EACH)
    else
        SCAN(Py_UCS4, NEXT_START_EACH)
    return 0;
}

void
tpuwatch_automaton_free(Automaton *a)
{
    PyMem_Free(a->lengths);
    PyMem_Free(a->entry);
    PyMem_Free(a->head_at);
    PyMem_Free(a->heads);
    PyMem_Free(a->same);
    PyMem_Free(a->delta);
    PyMem_Free(a->output);
    PyMem_Free(a->chain);
    PyMem_Free(a->reports);
    PyMem_Free(a->wide);
    a->lengths = a->entry = a->head_at = NULL;
    a->heads = NULL;
    a->same = NULL;
    a->delta = NULL;
    a->output = a->chain = NULL;
    a->reports = NULL;
    a->wide = NULL;
}

static int
compare_ucs4(const void *x, const void *y)
{
    Py_UCS4 p = *(const Py_UCS4 *)x, q = *(const Py_UCS4 *)y;
    return (p > q) - (p < q);
}

/* The classes: one per code point the keywords use (latin ones first), 0 for every other. */
static int
build_classes(Automaton *a, PyObject *keywords, Py_ssize_t total)
{
    uint8_t used[256] = {0};
    Py_UCS4 *wide = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(Py_UCS4));
    if (wide == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n_wide = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keywords); k++) {
        PyObject *word = PyTuple_GET_ITEM(keywords, k);
        for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(word); i++) {
            Py_UCS4 c = PyUnicode_READ_CHAR(word, i);
            if (c < 256)
                used[c] = 1;
            else
                wide[n_wide++] = c;
        }
    }
    qsort(wide, (size_t)n_wide, sizeof(Py_UCS4), compare_ucs4);
    Py_ssize_t unique = 0;
    for (Py_ssize_t i = 0; i < n_wide; i++)
        if (unique == 0 || wide[unique - 1] != wide[i])
            wide[unique++] = wide[i];
    a->wide = wide;
    a->n_wide = unique;
    int next = 1;
    for (int c = 0; c < 256; c++)
        a->latin[c] = used[c] ? (uint16_t)next++ : 0;
    a->first_wide = next;
    a->width = next + unique;
    if (a->width > MAX_CLASSES) {
        PyErr_SetString(PyExc_ValueError, "too many distinct characters in the keywords");
        return -1;
    }
    return 0;
}

/* The nibble tables of the characters that leave the root: each high nibble they have its own bit, up to eight (more
 * share the last bit: then the tables say yes to a few more characters, which step back to the root). */
static void
build_nibbles(Automaton *a)
{
    int bit[16], used = 0;
    memset(a->nibbles, 0, sizeof(a->nibbles));
    for (int c = 0; c < 256; c++) {
        if (c % 16 == 0)
            bit[c / 16] = -1;
        if (a->starts[c] && bit[c / 16] < 0)
            bit[c / 16] = used < 8 ? used++ : 7;
    }
    for (int c = 0; c < 256; c++)
        if (a->starts[c]) {
            a->nibbles[0][c % 16] |= (uint8_t)(1u << bit[c / 16]);
            a->nibbles[1][c / 16] |= (uint8_t)(1u << bit[c / 16]);
        }
#ifdef SCAN_SSSE3
    a->ssse3 = __builtin_cpu_supports("ssse3") && getenv("TPUWATCH_KEYWORDS_SCALAR") == NULL;
#endif
}

/* Adds word[skip:] to the trie: the state it ends at. */
static Py_ssize_t
trie_insert(Automaton *a, PyObject *word, Py_ssize_t skip, Py_ssize_t *states)
{
    Py_ssize_t s = 0;
    for (Py_ssize_t i = skip; i < PyUnicode_GET_LENGTH(word); i++) {
        uint16_t *next = &a->delta[s * a->width + class_of(a, PyUnicode_READ_CHAR(word, i))];
        if (*next == NONE)
            *next = (uint16_t)(*states)++;
        s = *next;
    }
    return s;
}

/* The trie of each keyword's part from its entry on (states counts them); the keywords whose parts end at one state
 * are a list (output, then same).  A repeated keyword is found once, as its first copy.  0, or -1 with an exception
 * set. */
static int
fill_trie(Automaton *a, PyObject *keywords, Py_ssize_t *states)
{
    PyObject *seen = PySet_New(NULL);
    if (seen == NULL)
        return -1;
    Py_ssize_t heads_used = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keywords); k++) {
        PyObject *word = PyTuple_GET_ITEM(keywords, k);
        Py_ssize_t entry = a->entry[k];
        a->lengths[k] = PyUnicode_GET_LENGTH(word) - entry;
        a->head_at[k] = heads_used;
        a->same[k] = -1;
        for (Py_ssize_t i = 0; i < entry; i++)
            a->heads[heads_used++] = PyUnicode_READ_CHAR(word, i);
        int repeated = PySet_Contains(seen, word);
        if (repeated == 0 && PySet_Add(seen, word) < 0)
            repeated = -1;
        if (repeated < 0) {
            Py_DECREF(seen);
            return -1;
        }
        if (repeated)
            continue;
        Py_ssize_t s = trie_insert(a, word, entry, states);
        a->same[k] = a->output[s];
        a->output[s] = (int32_t)k;
    }
    Py_DECREF(seen);
    return 0;
}

int
tpuwatch_automaton_build(Automaton *a, PyObject *keywords, PyObject *entries)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keywords), total = 0;
    if (entries != NULL && PyTuple_GET_SIZE(entries) != n) {
        PyErr_SetString(PyExc_ValueError, "entries must be as many as the keywords");
        return -1;
    }
    a->entry = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    if (a->entry == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *word = PyTuple_GET_ITEM(keywords, k);
        if (!PyUnicode_Check(word) || PyUnicode_GET_LENGTH(word) == 0) {
            PyErr_SetString(PyExc_TypeError, "keywords must be non-empty str");
            return -1;
        }
        if (entries != NULL) {
            a->entry[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(entries, k));
            if (a->entry[k] == -1 && PyErr_Occurred())
                return -1;
            if (a->entry[k] < 0 || a->entry[k] >= PyUnicode_GET_LENGTH(word)) {
                PyErr_SetString(PyExc_ValueError, "an entry must be an offset in its keyword");
                return -1;
            }
        }
        total += PyUnicode_GET_LENGTH(word);
        if (total > MAX_KEYWORD_CHARS) {
            PyErr_SetString(PyExc_ValueError, "too many keywords for one table");
            return -1;
        }
    }
    if (build_classes(a, keywords, total) < 0)
        return -1;
    const Py_ssize_t width = a->width, most = total + 1;
    if (most >= NONE || most > MAX_CELLS / width) {
        PyErr_SetString(PyExc_ValueError, "too many keywords for one table");
        return -1;
    }
    a->lengths = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    a->head_at = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    a->same = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    a->heads = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(Py_UCS4));
    a->delta = PyMem_Malloc((size_t)(most * width) * sizeof(uint16_t));
    a->output = PyMem_Malloc((size_t)most * sizeof(int32_t));
    a->chain = PyMem_Malloc((size_t)most * sizeof(int32_t));
    a->reports = PyMem_Malloc((size_t)most);
    if (!a->lengths || !a->head_at || !a->same || !a->heads || !a->delta || !a->output || !a->chain || !a->reports) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < most * width; i++)
        a->delta[i] = NONE;
    for (Py_ssize_t i = 0; i < most; i++)
        a->output[i] = a->chain[i] = -1;
    Py_ssize_t states = 1;
    if (fill_trie(a, keywords, &states) < 0)
        return -1;
    int32_t *fail = PyMem_Malloc((size_t)most * sizeof(int32_t));
    int32_t *queue = PyMem_Malloc((size_t)most * sizeof(int32_t));
    if (!fail || !queue) {
        PyMem_Free(fail);
        PyMem_Free(queue);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t head = 0, tail = 0;  /* breadth first: each state's failure state is done before it */
    for (Py_ssize_t c = 0; c < width; c++) {
        uint16_t *next = &a->delta[c];
        if (*next == NONE)
            *next = 0;
        else {
            fail[*next] = 0;
            queue[tail++] = *next;
        }
    }
    while (head < tail) {
        int32_t s = queue[head++];
        int32_t f = fail[s];
        a->chain[s] = a->output[f] >= 0 ? f : a->chain[f];
        for (Py_ssize_t c = 0; c < width; c++) {
            uint16_t *next = &a->delta[(Py_ssize_t)s * width + c];
            uint16_t by_fail = a->delta[(Py_ssize_t)f * width + c];
            if (*next == NONE)
                *next = by_fail;
            else {
                fail[*next] = by_fail;
                queue[tail++] = *next;
            }
        }
    }
    for (Py_ssize_t s = 0; s < states; s++)
        a->reports[s] = a->output[s] >= 0 || a->chain[s] >= 0;
    for (int c = 0; c < 256; c++)
        a->starts[c] = a->delta[a->latin[c]] != 0;
    build_nibbles(a);
    a->states = states;
    PyMem_Free(fail);
    PyMem_Free(queue);
    uint16_t *shrunk = PyMem_Realloc(a->delta, (size_t)(states * width) * sizeof(uint16_t));
    if (shrunk != NULL)
        a->delta = shrunk;
    return 0;
}
