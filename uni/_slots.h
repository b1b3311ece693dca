/* uni/_slots.h: what uni's C twins share -- reaching the slots of uni's own Python classes.
 *
 * A slot's offset is read once from its member descriptor (offset_of), which must be a
 * writable object slot; after that SLOT(obj, offset) is the slot itself. Every user checks
 * an object's type before using an offset on it.
 */
#ifndef UNI_SLOTS_H
#define UNI_SLOTS_H

#include <Python.h>
#include <structmember.h>

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* The offset of slot `name` of `type`: its member descriptor must be a writable object slot. */
static int
offset_of(PyTypeObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL)
        return -1;
    if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
        Py_DECREF(d);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", type->tp_name,
                     name);
        Py_DECREF(d);
        return -1;
    }
    *out = m->offset;
    Py_DECREF(d);
    return 0;
}

#endif
