/* uni.backends.blas._blascall: call a Fortran-ABI gemm or gemv with its arguments packed.
 *
 * ctypes converts every argument on every call (about 70 ns each here: 0.9 us of a 13-argument
 * gemm call, as long as the whole BLAS time of an 8x8 gemm). A prepared repeat passes the
 * same pointers each time, so it packs them once into a bytes object of native pointers and
 * calls call(address, packed) instead: one unpack, the call, with the GIL released around it
 * exactly as ctypes releases it (independent calls from several threads run concurrently).
 *
 * Optional: without it the prepared runs call through ctypes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef void (*fn13)(void *, void *, void *, void *, void *, void *, void *, void *, void *,
                     void *, void *, void *, void *);
typedef void (*fn11)(void *, void *, void *, void *, void *, void *, void *, void *, void *,
                     void *, void *);

static PyObject *
call(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "call(address, packed: bytes of 11 or 13 pointers)");
        return NULL;
    }
    void *fp = PyLong_AsVoidPtr(args[0]);
    if (fp == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "call(): a null routine address");
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(args[1]);
    void *a[13];
    if (size != 13 * (Py_ssize_t)sizeof(void *) && size != 11 * (Py_ssize_t)sizeof(void *)) {
        PyErr_Format(PyExc_ValueError, "call(): %zd bytes packed, expected 11 or 13 pointers",
                     size);
        return NULL;
    }
    memcpy(a, PyBytes_AS_STRING(args[1]), (size_t)size);
    if (size == 13 * (Py_ssize_t)sizeof(void *)) {
        Py_BEGIN_ALLOW_THREADS
        ((fn13)fp)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                   a[12]);
        Py_END_ALLOW_THREADS
    }
    else {
        Py_BEGIN_ALLOW_THREADS
        ((fn11)fp)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10]);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
     "call(address, packed): call the routine at address with 11 or 13 packed pointers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "uni.backends.blas._blascall",
    "Call a Fortran-ABI gemm or gemv with its pointer arguments packed once.", -1, methods,
};

PyMODINIT_FUNC
PyInit__blascall(void)
{
    return PyModule_Create(&module);
}
