/* The per-character work on a block of a kernel log besides finding keywords: its newlines and records, and
 * whether its bytes are text.  Functions of the module tpuwatch.kernel_log._keywords (see _keywords.c), which
 * tpuwatch.kernel_log.scan uses with the native matcher; its pure-Python path computes the same.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_text.h"

int
tpuwatch_text_range(PyObject *const *args, Py_ssize_t nargs, const char *usage, PyObject **text, Py_ssize_t *start,
           Py_ssize_t *end)
{
    if (nargs < 1 || nargs > 3 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *text = args[0];
    Py_ssize_t length = PyUnicode_GET_LENGTH(*text);
    *start = 0;
    *end = length;
    if (nargs > 1 && (*start = PyNumber_AsSsize_t(args[1], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return -1;
    if (nargs > 2 && (*end = PyNumber_AsSsize_t(args[2], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return -1;
    *start = *start < 0 ? 0 : (*start > length ? length : *start);
    *end = *end > length ? length : (*end < *start ? *start : *end);
    return 0;
}

/* Newlines in text[start:end], and the lines that begin in it without white space (the first line always counts). */
#define COUNT_LINES(TYPE)                                                           \
    {                                                                               \
        const TYPE *text = (const TYPE *)data;                                      \
        for (Py_ssize_t i = start; i < end; i++)                                    \
            if (text[i] == '\n') {                                                  \
                newlines++;                                                         \
                if (i + 1 < end && text[i + 1] != ' ' && text[i + 1] != '\t')       \
                    records++;                                                      \
            }                                                                       \
    }

PyDoc_STRVAR(lines_doc,
"lines(text, start=0, end=len(text), /)\n--\n\n"
"(newlines, records) of text[start:end]: its newlines, and the records whose first lines begin in it, a line\n"
"that begins with a space or a tab continuing the record above it; the line at start always begins one.");

static PyObject *
text_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    PyObject *text;
    Py_ssize_t start, end, newlines = 0, records;
    if (tpuwatch_text_range(args, nargs, "lines(text: str, start: int = 0, end: int = len(text))",
                            &text, &start, &end) < 0)
        return NULL;
    records = end > start;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    if (kind == PyUnicode_1BYTE_KIND) {  /* the common case: memchr to each newline */
        const char *text = (const char *)data;
        const char *at = text + start, *stop = text + end;
        while ((at = memchr(at, '\n', (size_t)(stop - at))) != NULL) {
            newlines++;
            at++;
            if (at < stop && *at != ' ' && *at != '\t')
                records++;
        }
    }
    else if (kind == PyUnicode_2BYTE_KIND)
        COUNT_LINES(Py_UCS2)
    else
        COUNT_LINES(Py_UCS4)
    return Py_BuildValue("(nn)", newlines, records);
}

typedef uint8_t bytes16 __attribute__((vector_size(16)));

/* 1 for each byte is_text() refuses: the control bytes but tab, LF and CR, and DEL. */
static const uint8_t junk[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    [0x7f] = 1,
};

PyDoc_STRVAR(is_text_doc,
"is_text(data, /)\n--\n\n"
"True if the bytes hold no control byte other than tab, LF and CR, nor DEL (UTF-8 validity is not checked).");

static PyObject *
text_is_text(PyObject *module, PyObject *data)
{
    (void)module;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "is_text(data: bytes)");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data), i = 0;
    /* 64 bytes at a time, as four vectors of 16 (GCC's vector extensions: SSE2 on x86-64, NEON on arm64): a byte
     * below 0x20 but tab, LF and CR, or equal to 0x7f, sets its lane in the accumulated mask. */
    for (; i + 64 <= n; i += 64) {
        bytes16 acc = {0};
        for (int k = 0; k < 64; k += 16) {
            bytes16 x;
            memcpy(&x, p + i + k, 16);
            acc |= ((x < 0x20) & (x != '\t') & (x != '\n') & (x != '\r')) | (x == 0x7f);
        }
        uint64_t lanes[2];
        memcpy(lanes, &acc, 16);
        if (lanes[0] | lanes[1])
            Py_RETURN_FALSE;
    }
    for (; i < n; i++)
        if (junk[p[i]])
            Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

PyMethodDef tpuwatch_text_functions[] = {
    {"lines", (PyCFunction)(void (*)(void))text_lines, METH_FASTCALL, lines_doc},
    {"is_text", text_is_text, METH_O, is_text_doc},
    {NULL, NULL, 0, NULL},
};

