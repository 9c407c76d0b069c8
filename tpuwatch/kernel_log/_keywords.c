/* Every occurrence of a set of keywords in a text, in one pass: an Aho-Corasick automaton.
 *
 * The optional native half of tpuwatch.kernel_log.prefilter (which falls back to
 * a compiled regex when this module is not built).  Keywords are matched exactly,
 * case-sensitively, as code points, in str objects of any kind; finds may overlap.
 * The automaton is a full transition table over the code points the keywords use
 * (every other code point is one class that leads back to the root), so a scan is
 * one table step per character, and a run of characters that begin no keyword is
 * skipped at the root without stepping.  Long texts are scanned without the GIL.
 * The module's functions (line counts, the control-byte check) are in _text.c.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_text.h"

#define MAX_KEYWORD_CHARS (1 << 24) /* all keywords together */
#define MAX_CLASSES 4096            /* distinct code points in the keywords, plus one */
#define MAX_CELLS (1 << 23)         /* states x classes of the table (16 MiB): beyond, the caller takes its regex */
#define NONE 0xFFFF                 /* no state: a table cell not filled in yet; so at most 65535 states */
#define NOGIL_CHARS 65536           /* texts this long are scanned with the GIL released */

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
    Py_ssize_t *lengths;  /* each keyword's length in code points */
    uint16_t *delta;      /* states x width: the next state */
    int32_t *output;      /* per state: the keyword ending there, or -1 */
    int32_t *chain;       /* per state: the next state down its suffix links with an output, or -1 */
    uint8_t *reports;     /* per state: 1 if a keyword ends there or down its suffix links */
    Py_UCS4 *wide;        /* the keywords' code points >= 256, sorted; their classes follow the latin ones */
    Py_ssize_t n_wide, first_wide, width, states;
    uint16_t latin[256];  /* class of each code point < 256; 0: in no keyword */
    uint8_t starts[256];  /* 1 if a code point < 256 leaves the root */
} Automaton;

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

/* Appends every keyword ending at state s, the text's position end being just past it. */
static int
report(const Automaton *a, Py_ssize_t s, Py_ssize_t end, Finds *f)
{
    for (Py_ssize_t o = a->output[s] >= 0 ? s : a->chain[s]; o >= 0; o = a->chain[o])
        if (finds_push(f, end - a->lengths[a->output[o]], a->output[o]) < 0)
            return -1;
    return 0;
}

/* The scan of text[start:end], one loop per string kind: every find into f, 0 when done, -1 when out of memory;
 * with f NULL, 1 at the first find and 0 when there is none. */
#define SCAN(TYPE)                                                                  \
    {                                                                               \
        const TYPE *text = (const TYPE *)data;                                      \
        for (Py_ssize_t i = start; i < end;) {                                      \
            if (s == 0) {                                                           \
                while (i < end && (text[i] > 255 ? class_of(a, text[i]) == 0        \
                                                 : !a->starts[text[i]]))            \
                    i++;                                                            \
                if (i == end)                                                       \
                    break;                                                          \
            }                                                                       \
            Py_UCS4 c = text[i++];                                                  \
            s = a->delta[s * width + (c < 256 ? a->latin[c] : class_of(a, c))];    \
            if (a->reports[s]) {                                                    \
                if (f == NULL)                                                      \
                    return 1;                                                       \
                if (report(a, s, i, f) < 0)                                         \
                    return -1;                                                      \
            }                                                                       \
        }                                                                           \
    }

static int
scan(const Automaton *a, int kind, const void *data, Py_ssize_t start, Py_ssize_t end, Finds *f)
{
    Py_ssize_t s = 0;
    const Py_ssize_t width = a->width;
    if (kind == PyUnicode_1BYTE_KIND)
        SCAN(Py_UCS1)
    else if (kind == PyUnicode_2BYTE_KIND)
        SCAN(Py_UCS2)
    else
        SCAN(Py_UCS4)
    return 0;
}

static int
compare_finds(const void *x, const void *y)
{
    const Find *p = x, *q = y;
    if (p->start != q->start)
        return p->start < q->start ? -1 : 1;
    return (p->keyword > q->keyword) - (p->keyword < q->keyword);
}

static void
automaton_free_tables(Automaton *a)
{
    PyMem_Free(a->lengths);
    PyMem_Free(a->delta);
    PyMem_Free(a->output);
    PyMem_Free(a->chain);
    PyMem_Free(a->reports);
    PyMem_Free(a->wide);
    a->lengths = NULL;
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

static int
automaton_build(Automaton *a, PyObject *keywords)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keywords), total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *word = PyTuple_GET_ITEM(keywords, k);
        if (!PyUnicode_Check(word) || PyUnicode_GET_LENGTH(word) == 0) {
            PyErr_SetString(PyExc_TypeError, "keywords must be non-empty str");
            return -1;
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
    a->delta = PyMem_Malloc((size_t)(most * width) * sizeof(uint16_t));
    a->output = PyMem_Malloc((size_t)most * sizeof(int32_t));
    a->chain = PyMem_Malloc((size_t)most * sizeof(int32_t));
    a->reports = PyMem_Malloc((size_t)most);
    int32_t *fail = PyMem_Malloc((size_t)most * sizeof(int32_t));
    int32_t *queue = PyMem_Malloc((size_t)most * sizeof(int32_t));
    if (!a->lengths || !a->delta || !a->output || !a->chain || !a->reports || !fail || !queue) {
        PyMem_Free(fail);
        PyMem_Free(queue);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < most * width; i++)
        a->delta[i] = NONE;
    for (Py_ssize_t i = 0; i < most; i++)
        a->output[i] = a->chain[i] = -1;
    Py_ssize_t states = 1;
    for (Py_ssize_t k = 0; k < n; k++) {  /* the trie */
        PyObject *word = PyTuple_GET_ITEM(keywords, k);
        Py_ssize_t len = PyUnicode_GET_LENGTH(word);
        Py_ssize_t s = 0;
        for (Py_ssize_t i = 0; i < len; i++) {
            uint16_t *next = &a->delta[s * width + class_of(a, PyUnicode_READ_CHAR(word, i))];
            if (*next == NONE)
                *next = (uint16_t)states++;
            s = *next;
        }
        a->lengths[k] = len;
        if (a->output[s] < 0)  /* a repeated keyword is found once, as its first copy */
            a->output[s] = (int32_t)k;
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
    a->states = states;
    PyMem_Free(fail);
    PyMem_Free(queue);
    uint16_t *shrunk = PyMem_Realloc(a->delta, (size_t)(states * width) * sizeof(uint16_t));
    if (shrunk != NULL)
        a->delta = shrunk;
    return 0;
}

static int
Automaton_init(Automaton *self, PyObject *args, PyObject *kwds)
{
    PyObject *keywords;
    static char *kwlist[] = {"keywords", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!:Automaton", kwlist, &PyTuple_Type, &keywords))
        return -1;
    if (self->delta != NULL) {  /* a scan without the GIL may be reading the tables */
        PyErr_SetString(PyExc_TypeError, "Automaton is already initialised");
        return -1;
    }
    Py_XSETREF(self->keywords, Py_NewRef(keywords));
    if (automaton_build(self, keywords) < 0) {
        automaton_free_tables(self);
        return -1;
    }
    return 0;
}

static void
Automaton_dealloc(Automaton *self)
{
    automaton_free_tables(self);
    Py_XDECREF(self->keywords);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* scan() of text[start:end], without the GIL for a long text. */
static int
scan_text(const Automaton *a, PyObject *text, Py_ssize_t start, Py_ssize_t end, Finds *f)
{
    int result;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    if (end - start >= NOGIL_CHARS) {
        Py_BEGIN_ALLOW_THREADS
        result = scan(a, kind, data, start, end, f);
        Py_END_ALLOW_THREADS
    }
    else
        result = scan(a, kind, data, start, end, f);
    return result;
}

/* The arguments of finds() and search(), as tpuwatch_text_range() reads them, of an initialised automaton. */
static int
automaton_range(const Automaton *self, PyObject *const *args, Py_ssize_t nargs, const char *usage,
                PyObject **text, Py_ssize_t *start, Py_ssize_t *end)
{
    if (tpuwatch_text_range(args, nargs, usage, text, start, end) < 0)
        return -1;
    if (self->delta == NULL) {
        PyErr_SetString(PyExc_ValueError, "Automaton not initialised");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(finds_doc,
"finds(text, start=0, end=len(text), /)\n--\n\n"
"Every occurrence of a keyword in text[start:end], as (offset, keyword) sorted by offset, then by the\n"
"keyword's index; occurrences may overlap.");

static PyObject *
Automaton_finds(Automaton *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *text;
    Py_ssize_t start, end;
    if (automaton_range(self, args, nargs, "finds(text: str, start: int = 0, end: int = len(text))",
                        &text, &start, &end) < 0)
        return NULL;
    Finds f = {NULL, 0, 0};
    if (scan_text(self, text, start, end, &f) < 0) {
        PyMem_RawFree(f.items);
        return PyErr_NoMemory();
    }
    if (f.count > 1)
        qsort(f.items, (size_t)f.count, sizeof(Find), compare_finds);
    PyObject *out = PyList_New(f.count);
    for (Py_ssize_t i = 0; out != NULL && i < f.count; i++) {
        PyObject *offset = PyLong_FromSsize_t(f.items[i].start);
        PyObject *item = offset == NULL ? NULL : PyTuple_New(2);
        if (item == NULL) {
            Py_XDECREF(offset);
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(item, 0, offset);
        PyTuple_SET_ITEM(item, 1, Py_NewRef(PyTuple_GET_ITEM(self->keywords, f.items[i].keyword)));
        PyList_SET_ITEM(out, i, item);
    }
    PyMem_RawFree(f.items);
    return out;
}

PyDoc_STRVAR(search_doc,
"search(text, start=0, end=len(text), /)\n--\n\n"
"True if a keyword occurs in text[start:end]: finds() without building its answer, stopping at the first.");

static PyObject *
Automaton_search(Automaton *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *text;
    Py_ssize_t start, end;
    if (automaton_range(self, args, nargs, "search(text: str, start: int = 0, end: int = len(text))",
                        &text, &start, &end) < 0)
        return NULL;
    return PyBool_FromLong(scan_text(self, text, start, end, NULL));
}

static PyObject *
Automaton_get_states(Automaton *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->states);
}

static PyMethodDef Automaton_methods[] = {
    {"finds", (PyCFunction)(void (*)(void))Automaton_finds, METH_FASTCALL, finds_doc},
    {"search", (PyCFunction)(void (*)(void))Automaton_search, METH_FASTCALL, search_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Automaton_getset[] = {
    {"states", (getter)Automaton_get_states, NULL, "The automaton's states (its table has this many rows).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Automaton_members[] = {
    {"keywords", T_OBJECT, offsetof(Automaton, keywords), READONLY, "The keywords, as given."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AutomatonType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tpuwatch.kernel_log._keywords.Automaton",
    .tp_doc = PyDoc_STR("Automaton(keywords: tuple[str, ...]): finds every occurrence of the keywords in one pass."),
    .tp_basicsize = sizeof(Automaton),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Automaton_init,
    .tp_dealloc = (destructor)Automaton_dealloc,
    .tp_methods = Automaton_methods,
    .tp_members = Automaton_members,
    .tp_getset = Automaton_getset,
};

static struct PyModuleDef keywords_module = {
    PyModuleDef_HEAD_INIT,
    .m_methods = tpuwatch_text_functions,
    .m_name = "tpuwatch.kernel_log._keywords",
    .m_doc = "Every occurrence of a set of keywords in a text, in one pass (Aho-Corasick).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__keywords(void)
{
    if (PyType_Ready(&AutomatonType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&keywords_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Automaton", (PyObject *)&AutomatonType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
