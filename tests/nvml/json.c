/* A bounded JSON reader for the NVML stand-in (see json.h).  Recursive descent, depth-limited. */
#include "json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct parser {
    struct jdoc *doc;
    char *p;
    char *end;
};

static void skip_space(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int new_node(struct parser *ps, enum jtype type) {
    struct jdoc *doc = ps->doc;
    if (doc->used == doc->cap) {
        if (doc->cap >= JSON_MAX_NODES)
            return -1;
        int cap = doc->cap * 2 < JSON_MAX_NODES ? doc->cap * 2 : JSON_MAX_NODES;
        struct jnode *grown = realloc(doc->nodes, (size_t)cap * sizeof *grown);
        if (grown == NULL)
            return -1;
        doc->nodes = grown;
        doc->cap = cap;
    }
    struct jnode *n = &doc->nodes[doc->used];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->first = n->next = -1;
    return doc->used++;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Decodes the string at ps->p (after its opening quote) in place; returns its start or NULL. */
static char *parse_string(struct parser *ps) {
    char *out = ps->p, *start = ps->p;
    while (ps->p < ps->end) {
        unsigned char c = (unsigned char)*ps->p++;
        if (c == '"') {
            *out = '\0';
            return start;
        }
        if (c < 0x20)
            return NULL;
        if (c != '\\') {
            *out++ = (char)c;
            continue;
        }
        if (ps->p >= ps->end)
            return NULL;
        char e = *ps->p++;
        switch (e) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '/': *out++ = '/'; break;
        case 'b': *out++ = '\b'; break;
        case 'f': *out++ = '\f'; break;
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (ps->end - ps->p < 4 || hex4(ps->p, &cp) != 0 || cp == 0)
                return NULL;
            ps->p += 4; /* \uXXXX is six bytes and yields at most three: the output never passes the input */
            if (cp < 0x80) {
                *out++ = (char)cp;
            } else if (cp < 0x800) {
                *out++ = (char)(0xC0 | (cp >> 6));
                *out++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *out++ = (char)(0xE0 | (cp >> 12));
                *out++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *out++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            return NULL;
        }
    }
    return NULL;
}

static int parse_number(struct parser *ps, int node) {
    char *start = ps->p, *q = ps->p;
    int integral = 1;
    if (q < ps->end && *q == '-') q++;
    if (q >= ps->end || *q < '0' || *q > '9') return -1;
    if (*q == '0') q++;
    else while (q < ps->end && *q >= '0' && *q <= '9') q++;
    if (q < ps->end && *q == '.') {
        integral = 0;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') return -1;
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9') return -1;
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    char saved = *q; /* the text is NUL-terminated, so q may be end */
    *q = '\0';
    struct jnode *n = &ps->doc->nodes[node];
    n->number = strtod(start, NULL);
    if (integral) {
        errno = 0;
        n->integer = strtoll(start, NULL, 10);
        n->integral = errno == 0;
        if (errno == ERANGE && *start != '-') { /* beyond LLONG_MAX: keep it if it fits unsigned 64 bits */
            errno = 0;
            unsigned long long u = strtoull(start, NULL, 10);
            if (errno == 0) {
                n->integer = (long long)u;
                n->integral = 2; /* unsigned */
            }
        }
    }
    *q = saved;
    ps->p = q;
    return 0;
}

static int parse_value(struct parser *ps, int depth);

static int parse_container(struct parser *ps, int node, int depth, char close, int object) {
    int last = -1;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        const char *key = NULL;
        skip_space(ps);
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"') return -1;
            ps->p++;
            if ((key = parse_string(ps)) == NULL) return -1;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':') return -1;
            ps->p++;
        }
        int child = parse_value(ps, depth + 1);
        if (child < 0) return -1;
        ps->doc->nodes[child].key = key;
        if (last < 0) ps->doc->nodes[node].first = child;
        else ps->doc->nodes[last].next = child;
        last = child;
        ps->doc->nodes[node].count++;
        skip_space(ps);
        if (ps->p >= ps->end) return -1;
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            return 0;
        }
        return -1;
    }
}

static int literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return -1;
    ps->p += n;
    return 0;
}

static int parse_value(struct parser *ps, int depth) {
    if (depth > JSON_MAX_DEPTH) return -1;
    skip_space(ps);
    if (ps->p >= ps->end) return -1;
    int node;
    char c = *ps->p;
    if (c == '{' || c == '[') {
        ps->p++;
        if ((node = new_node(ps, c == '{' ? J_OBJECT : J_ARRAY)) < 0) return -1;
        return parse_container(ps, node, depth, c == '{' ? '}' : ']', c == '{') == 0 ? node : -1;
    }
    if (c == '"') {
        ps->p++;
        if ((node = new_node(ps, J_STRING)) < 0) return -1;
        const char *s = parse_string(ps);
        ps->doc->nodes[node].str = s;
        return s ? node : -1;
    }
    if (c == 't' || c == 'f') {
        if ((node = new_node(ps, J_BOOL)) < 0 || literal(ps, c == 't' ? "true" : "false") != 0) return -1;
        ps->doc->nodes[node].number = c == 't';
        return node;
    }
    if (c == 'n') {
        if ((node = new_node(ps, J_NULL)) < 0 || literal(ps, "null") != 0) return -1;
        return node;
    }
    if ((node = new_node(ps, J_NUMBER)) < 0) return -1;
    return parse_number(ps, node) == 0 ? node : -1;
}

int jparse(struct jdoc *doc, char *text, size_t len) {
    memset(doc, 0, sizeof *doc);
    if (len > JSON_MAX_BYTES) return -1;
    doc->cap = 256; /* grown by doubling up to JSON_MAX_NODES */
    doc->nodes = malloc((size_t)doc->cap * sizeof *doc->nodes);
    if (doc->nodes == NULL) return -1;
    doc->text = text;
    struct parser ps = {doc, text, text + len};
    int root = parse_value(&ps, 0);
    if (root >= 0) {
        skip_space(&ps);
        if (ps.p == ps.end) return 0;
    }
    jfree(doc);
    return -1;
}

void jfree(struct jdoc *doc) {
    free(doc->nodes);
    doc->nodes = NULL;
    doc->used = doc->cap = 0;
}

enum jtype jtypeof(const struct jdoc *doc, int node) {
    return node < 0 || node >= doc->used ? J_NULL : doc->nodes[node].type;
}

int jget(const struct jdoc *doc, int node, const char *key) {
    if (jtypeof(doc, node) != J_OBJECT) return -1;
    int found = -1; /* the last of duplicate members wins, as in Python's json */
    for (int c = doc->nodes[node].first; c >= 0; c = doc->nodes[c].next)
        if (strcmp(doc->nodes[c].key, key) == 0) found = c;
    return found;
}

int jat(const struct jdoc *doc, int node, int index) {
    if (jtypeof(doc, node) != J_ARRAY || index < 0) return -1;
    int c = doc->nodes[node].first;
    for (int i = 0; c >= 0 && i < index; i++) c = doc->nodes[c].next;
    return c;
}

int jfirst(const struct jdoc *doc, int node) {
    enum jtype t = jtypeof(doc, node);
    return t == J_ARRAY || t == J_OBJECT ? doc->nodes[node].first : -1;
}

int jnext(const struct jdoc *doc, int node) {
    return node < 0 || node >= doc->used ? -1 : doc->nodes[node].next;
}

int jlen(const struct jdoc *doc, int node) {
    return jtypeof(doc, node) == J_ARRAY ? doc->nodes[node].count : 0;
}

int juint(const struct jdoc *doc, int node, unsigned long long max, unsigned long long *out) {
    if (jtypeof(doc, node) != J_NUMBER || !doc->nodes[node].integral) return -1;
    const struct jnode *n = &doc->nodes[node];
    if (n->integral == 1 && n->integer < 0) return -1;
    unsigned long long v = (unsigned long long)n->integer;
    if (v > max) return -1;
    *out = v;
    return 0;
}

const char *jstr(const struct jdoc *doc, int node) {
    return jtypeof(doc, node) == J_STRING ? doc->nodes[node].str : NULL;
}

int jtrue(const struct jdoc *doc, int node) {
    enum jtype t = jtypeof(doc, node);
    return (t == J_BOOL || t == J_NUMBER) && doc->nodes[node].number != 0;
}
