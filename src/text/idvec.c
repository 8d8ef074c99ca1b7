/* IdVec: doubling growth from 256 ids. */
#include "text/idvec.h"

#include <stdlib.h>
#include <string.h>

#include "core/err.h"

void idvec_push(IdVec *v, uint32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 256;
        v->ids = xrealloc(v->ids, v->cap * sizeof *v->ids);
    }
    v->ids[v->n++] = id;
}

void idvec_free(IdVec *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}
