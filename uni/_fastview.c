/* uni._fastview: ``t[i:j]`` of a vector tensor in C.
 *
 * The twin of uni._tensor._slice_vector_py, which stays the reference and the fallback where
 * this module is not built. It handles exactly what that function handles -- a slice with no
 * step, plain int (or None) bounds inside the vector -- and returns None for anything else,
 * so that Tensor.__getitem__ goes its general way. Why C: a fresh view per call (``x[0:n]``)
 * is a third of a small transform on fresh views, and most of that is interpreter work.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_slots.h"

static PyTypeObject *t_tensor;
static PyObject *vectors, *vector_mapping, *s_extents, *s_shape, *s_strides, *s_general;
static Py_ssize_t o_storage, o_accessor, o_mapping, o_offset;
static int configured;



static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *tensor, *view_base;
    if (configured) {
        PyErr_SetString(PyExc_RuntimeError, "uni._fastview is configured once");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyType_Type, &tensor, &PyType_Type, &view_base,
                          &PyDict_Type, &vectors, &vector_mapping))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)tensor, (PyTypeObject *)view_base)) {
        PyErr_SetString(PyExc_TypeError, "configure(): the tensor type must be a view");
        return NULL;
    }
    PyTypeObject *base = (PyTypeObject *)view_base;
    if (offset_of(base, "_storage", &o_storage) || offset_of(base, "_accessor", &o_accessor)
        || offset_of(base, "_mapping", &o_mapping) || offset_of(base, "_offset", &o_offset))
        return NULL;
    if ((s_extents = PyUnicode_InternFromString("extents")) == NULL
        || (s_shape = PyUnicode_InternFromString("shape")) == NULL
        || (s_strides = PyUnicode_InternFromString("strides")) == NULL
        || (s_general = PyUnicode_InternFromString("_getitem_py")) == NULL)
        return NULL;
    Py_INCREF(tensor);
    t_tensor = (PyTypeObject *)tensor;
    Py_INCREF(vectors);
    Py_INCREF(vector_mapping);
    configured = 1;
    Py_RETURN_NONE;
}

/* A slice bound: None (the default) or an exact int that fits; 0 when it is anything else. */
static int
bound(PyObject *v, Py_ssize_t fallback, Py_ssize_t *out)
{
    if (v == Py_None) {
        *out = fallback;
        return 1;
    }
    if (!PyLong_CheckExact(v))
        return 0;
    *out = PyLong_AsSsize_t(v);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The view ``view[key]`` if it is the plain vector case, else None (a new reference). */
static PyObject *
quick(PyObject *view, PyObject *key)
{
    if (!configured || !PySlice_Check(key) || !PyObject_TypeCheck(view, t_tensor))
        Py_RETURN_NONE;
    PySliceObject *sl = (PySliceObject *)key;
    if (sl->step != Py_None)
        Py_RETURN_NONE;
    PyObject *mapping = SLOT(view, o_mapping), *storage = SLOT(view, o_storage);
    PyObject *accessor = SLOT(view, o_accessor), *offset = SLOT(view, o_offset);
    if (mapping == NULL || storage == NULL || accessor == NULL || offset == NULL)
        Py_RETURN_NONE;
    /* Held, not borrowed: the mapping's attributes and _vector_mapping are Python code,
     * which could rebind the view's slots meanwhile. */
    Py_INCREF(mapping);
    Py_INCREF(storage);
    Py_INCREF(accessor);
    Py_INCREF(offset);
    PyObject *result = NULL, *extents = NULL, *shape = NULL, *strides = NULL, *stride = NULL;
    PyObject *pair = NULL, *found = NULL, *new_offset = NULL;
    if ((extents = PyObject_GetAttr(mapping, s_extents)) == NULL
        || (shape = PyObject_GetAttr(extents, s_shape)) == NULL)
        goto done;
    if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != 1)
        goto none;
    PyObject *extent_obj = PyTuple_GET_ITEM(shape, 0);
    if (!PyLong_CheckExact(extent_obj))
        goto none;  /* another library's mapping: the Python method answers */
    Py_ssize_t extent = PyLong_AsSsize_t(extent_obj);
    if (extent == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        goto none;
    }
    Py_ssize_t start, stop;
    if (!bound(sl->start, 0, &start) || !bound(sl->stop, extent, &stop)
        || !(0 <= start && start <= stop && stop <= extent))
        goto none;
    if ((strides = PyObject_GetAttr(mapping, s_strides)) == NULL
        || (stride = PySequence_GetItem(strides, 0)) == NULL)
        goto done;
    if (!PyLong_CheckExact(stride))
        goto none;
    Py_ssize_t count = stop - start;
    if ((pair = Py_BuildValue("(nO)", count, stride)) == NULL)
        goto done;
    found = PyDict_GetItemWithError(vectors, pair);  /* borrowed */
    if (found != NULL)
        Py_INCREF(found);
    else if (PyErr_Occurred()
             || (found = PyObject_CallFunction(vector_mapping, "nO", count, stride)) == NULL)
        goto done;
    if (count) {
        PyObject *start_obj = PyLong_FromSsize_t(start), *step = NULL;
        if (start_obj != NULL)
            step = PyNumber_Multiply(start_obj, stride);
        Py_XDECREF(start_obj);
        if (step == NULL)
            goto done;
        new_offset = PyNumber_Add(offset, step);
        Py_DECREF(step);
        if (new_offset == NULL)
            goto done;
    }
    else {
        Py_INCREF(offset);
        new_offset = offset;
    }
    PyObject *out = t_tensor->tp_alloc(t_tensor, 0);
    if (out == NULL)
        goto done;
    Py_INCREF(storage);
    SLOT(out, o_storage) = storage;
    Py_INCREF(accessor);
    SLOT(out, o_accessor) = accessor;
    SLOT(out, o_mapping) = found;  /* the reference found holds moves into the view */
    found = NULL;
    SLOT(out, o_offset) = new_offset;
    new_offset = NULL;
    result = out;
    goto done;
none:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_DECREF(mapping);
    Py_DECREF(storage);
    Py_DECREF(accessor);
    Py_DECREF(offset);
    Py_XDECREF(extents);
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    Py_XDECREF(stride);
    Py_XDECREF(pair);
    Py_XDECREF(found);
    Py_XDECREF(new_offset);
    return result;
}

/* slice_vector(view, key): quick() for Python (the tests compare it with the Python twin). */
static PyObject *
slice_vector(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "slice_vector(view, key)");
        return NULL;
    }
    return quick(args[0], args[1]);
}

/* Tensor.__getitem__: quick() where it applies, else the general Python method. As a method
 * descriptor of the class, ``t[i:j]`` runs no Python frame at all. */
static PyObject *
getitem(PyObject *self, PyObject *key)
{
    if (PySlice_Check(key)) {
        PyObject *view = quick(self, key);
        if (view != Py_None)
            return view;  /* the view, or NULL with the error set */
        Py_DECREF(view);
    }
    return PyObject_CallMethodOneArg(self, s_general, key);  /* as self._getitem_py(key) */
}

static PyMethodDef getitem_def = {
    "__getitem__", getitem, METH_O,
    "__getitem__($self, key, /)\n--\n\nself[key]: a view (metadata only). A plain vector slice is made in C "
    "(uni/_fastview.c); every other key by the Python method (Tensor._getitem_py).",
};

/* getitem_method(): Tensor.__getitem__ as a method descriptor of the configured class. */
static PyObject *
getitem_method(PyObject *self, PyObject *unused)
{
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "uni._fastview is not configured");
        return NULL;
    }
    return PyDescr_NewMethod(t_tensor, &getitem_def);
}

/* What this build was written against (uni._tensor checks it: FASTVIEW_VERSION). */
#define FASTVIEW_VERSION 1

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Tensor, StorageView, vectors, vector_mapping): once, from uni._tensor."},
    {"getitem_method", getitem_method, METH_NOARGS,
     "getitem_method(): the C Tensor.__getitem__ (a method descriptor of Tensor)."},
    {"slice_vector", (PyCFunction)(void (*)(void))slice_vector, METH_FASTCALL,
     "slice_vector(view, key): view[key] for a plain slice of a vector, else None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "uni._fastview",
    "t[i:j] of a vector tensor in C (a twin of uni._tensor._slice_vector_py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__fastview(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", FASTVIEW_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
