/* Shared by _keywords.c and _text.c, two of the sources of tpuwatch.kernel_log._keywords. */

#ifndef TPUWATCH_TEXT_H
#define TPUWATCH_TEXT_H

#include <Python.h>

/* The text and the bounds of text[start:end] from the arguments (text, start=0, end=len(text)), clamped as slices
 * are; -1 with an exception set (``usage`` as its message for a wrong text) when they are not those. */
int tpuwatch_text_range(PyObject *const *args, Py_ssize_t nargs, const char *usage, PyObject **text, Py_ssize_t *start,
               Py_ssize_t *end);

/* The module's functions: lines(), is_text(). */
extern PyMethodDef tpuwatch_text_functions[];

#endif
