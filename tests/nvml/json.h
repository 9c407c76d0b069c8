/* A bounded JSON reader for the NVML stand-in's state file (written for tpuwatch's tests; RFC 8259).
 *
 * jparse() builds a flat array of nodes from a NUL-terminated text it decodes in place; every limit
 * (size, depth, node count) makes it fail, never overrun.  Nodes are found by index; -1 is "absent".
 */
#ifndef FAKENVML_JSON_H
#define FAKENVML_JSON_H

#include <stddef.h>

#pragma GCC visibility push(hidden) /* the library exports NVML's functions only */

#define JSON_MAX_BYTES (4u << 20) /* a state file larger than this is refused */
#define JSON_MAX_DEPTH 32
#define JSON_MAX_NODES 200000

enum jtype { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT };

struct jnode {
    enum jtype type;
    const char *key;     /* the member name when the parent is an object */
    const char *str;     /* J_STRING: decoded, NUL-terminated */
    double number;       /* J_NUMBER, J_BOOL */
    int integral;        /* J_NUMBER written without fraction or exponent, within 64 bits */
    long long integer;   /* J_NUMBER when integral */
    int first, next;     /* first child, next sibling: node indices or -1 */
    int count;           /* children of an array or object */
};

struct jdoc {
    struct jnode *nodes;
    int used, cap;
    char *text;
};

/* Parse text (length len, decoded in place; text[len] must be NUL).  0 on success, -1 on any error. */
int jparse(struct jdoc *doc, char *text, size_t len);
void jfree(struct jdoc *doc);
/* The member called key of object node, or -1. */
int jget(const struct jdoc *doc, int node, const char *key);
/* The index-th element of array node, or -1. */
int jat(const struct jdoc *doc, int node, int index);
/* The first child of an array or object and the next sibling, or -1: loops that visit every element. */
int jfirst(const struct jdoc *doc, int node);
int jnext(const struct jdoc *doc, int node);
/* The number of elements of an array node, 0 for anything else. */
int jlen(const struct jdoc *doc, int node);
enum jtype jtypeof(const struct jdoc *doc, int node); /* J_NULL for -1 */
/* An integral number node as an unsigned 64-bit value in [0, max]; -1 if it is not one. */
int juint(const struct jdoc *doc, int node, unsigned long long max, unsigned long long *out);
const char *jstr(const struct jdoc *doc, int node); /* NULL unless a string */
int jtrue(const struct jdoc *doc, int node);      /* a true boolean or a non-zero number */

#pragma GCC visibility pop

#endif
