/* tpuwatch.kernel_log._keywords: every occurrence of a set of keywords in a text, in one pass.
 *
 * The optional native half of tpuwatch.kernel_log.prefilter (which falls back to a compiled regex when this module
 * is not built): the Python type Automaton around the automaton of _automaton.c.  Long texts are scanned without
 * the GIL.  The module's functions (line counts, the control-byte check) are in _text.c.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>

#include "_automaton.h"
#include "_text.h"

#define NOGIL_CHARS 65536           /* texts this long are scanned with the GIL released */

static int
compare_finds(const void *x, const void *y)
{
    const Find *p = x, *q = y;
    if (p->start != q->start)
        return p->start < q->start ? -1 : 1;
    return (p->keyword > q->keyword) - (p->keyword < q->keyword);
}

static int
Automaton_init(Automaton *self, PyObject *args, PyObject *kwds)
{
    PyObject *keywords, *entries = Py_None;
    static char *kwlist[] = {"keywords", "entries", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|O:Automaton", kwlist, &PyTuple_Type, &keywords, &entries))
        return -1;
    if (entries != Py_None && !PyTuple_Check(entries)) {
        PyErr_SetString(PyExc_TypeError, "entries must be a tuple of int or None");
        return -1;
    }
    if (self->delta != NULL) {  /* a scan without the GIL may be reading the tables */
        PyErr_SetString(PyExc_TypeError, "Automaton is already initialised");
        return -1;
    }
    Py_XSETREF(self->keywords, Py_NewRef(keywords));
    if (tpuwatch_automaton_build(self, keywords, entries == Py_None ? NULL : entries) < 0) {
        tpuwatch_automaton_free(self);
        return -1;
    }
    return 0;
}

static void
Automaton_dealloc(Automaton *self)
{
    tpuwatch_automaton_free(self);
    Py_XDECREF(self->keywords);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The scan of text[start:end] (tpuwatch_automaton_scan), without the GIL for a long text. */
static int
scan_text(const Automaton *a, PyObject *text, Py_ssize_t start, Py_ssize_t end, Finds *f)
{
    int result;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    if (end - start >= NOGIL_CHARS) {
        Py_BEGIN_ALLOW_THREADS
        result = tpuwatch_automaton_scan(a, kind, data, start, end, f);
        Py_END_ALLOW_THREADS
    }
    else
        result = tpuwatch_automaton_scan(a, kind, data, start, end, f);
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

static PyObject *
Automaton_get_vector(Automaton *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->ssse3);
}

static PyGetSetDef Automaton_getset[] = {
    {"states", (getter)Automaton_get_states, NULL, "The automaton's states (its table has this many rows).", NULL},
    {"vector", (getter)Automaton_get_vector, NULL,
     "True if 1-byte texts are skipped 16 characters at a time (x86-64 with SSSE3, unless the environment has "
     "TPUWATCH_KEYWORDS_SCALAR), else one at a time.", NULL},
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
