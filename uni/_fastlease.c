/* uni._fastlease: the uncontended host lease in C.
 *
 * A twin of two Python functions in uni/_access.py, which stay the reference and the
 * fallback where this module is not built:
 *
 *   open_lease(plan)     -- LeasePlan.open_now() wrapped in plan.lease (open_lease_py)
 *   finish_access(acc)   -- Access.finish(acc): the plain-memory success case here, anything
 *                           else by calling acc.finish() itself
 *
 * Why C: in CPython 3.11 the Python version is about 20 interpreter-level attribute stores,
 * 7 frames and two lock round trips; its floor, measured with everything inlined, is more
 * than 10x a bare threading.Lock round trip. Here the stores are direct slot writes.
 *
 * How it stays the same as the Python code:
 * - It touches only slots of uni's own classes, whose offsets it reads from their member
 *   descriptors once (configure()), and checks every object's type before using an offset.
 * - Whenever the Python code would do anything but the plain case (a stale queue range,
 *   an owner to make, fences to look at, waiters to grant and wake), it calls the very
 *   Python method that does it, under the same lock, in the same order.
 * - It never decides differently: every condition under which open_now returns None makes
 *   open_lease return None (the caller then takes the general path).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>

#include "_slots.h"

/* Types, objects and slot offsets from configure(). */
static PyTypeObject *t_plan, *t_spec, *t_queue, *t_request, *t_opened, *t_owner, *t_lease;
static PyObject *owner_var, *current_owner, *no_fences, *state_open, *state_ended;
/* threading.Lock's type and its unbound acquire/release: called without a method lookup. */
static PyTypeObject *t_lock;
static PyObject *lock_acquire, *lock_release;
static PyObject *s_acquire, *s_release, *s_access_queue, *s_where_for, *s_fences_for_locked,
    *s_grant_locked, *s_wake, *s_finish;

static Py_ssize_t o_plan_handle, o_plan_spec, o_plan_where, o_plan_mode, o_plan_write,
    o_plan_lease;
static Py_ssize_t o_spec_storage;
static Py_ssize_t o_q_lock, o_q_entries, o_q_has_poison, o_q_retired, o_q_tail, o_q_pending;
static Py_ssize_t o_r_waiter, o_r_write, o_r_fences, o_r_granted, o_r_group, o_r_hi,
    o_r_holder, o_r_lo, o_r_mode, o_r_owner, o_r_queue, o_r_released;
static Py_ssize_t o_a_lock, o_a_primary_done, o_a_state, o_a_error, o_a_handle,
    o_a_poison_range, o_a_spec, o_a_unclaimed, o_a_written;
static Py_ssize_t o_owner_ident, o_lease_access;
static int configured;


/* Store a new reference to v in a slot, dropping what was there. */
static inline void
put(PyObject *obj, Py_ssize_t off, PyObject *v)
{
    PyObject *old = SLOT(obj, off);
    Py_INCREF(v);
    SLOT(obj, off) = v;
    Py_XDECREF(old);
}


static int
type_arg(PyObject *obj, PyTypeObject **out)
{
    if (!PyType_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "configure() expects types");
        return -1;
    }
    Py_INCREF(obj);
    *out = (PyTypeObject *)obj;
    return 0;
}

static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *plan, *spec, *queue, *request, *opened, *owner, *lease;
    if (configured) {
        PyErr_SetString(PyExc_RuntimeError, "uni._fastlease is configured once");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOO", &plan, &spec, &queue, &request, &opened,
                          &owner, &lease, &owner_var, &current_owner, &no_fences, &state_open,
                          &state_ended))
        return NULL;
    if (type_arg(plan, &t_plan) || type_arg(spec, &t_spec) || type_arg(queue, &t_queue)
        || type_arg(request, &t_request) || type_arg(opened, &t_opened)
        || type_arg(owner, &t_owner) || type_arg(lease, &t_lease))
        return NULL;
    if (!PyContextVar_CheckExact(owner_var)) {
        PyErr_SetString(PyExc_TypeError, "configure(): the owner must be a ContextVar");
        return NULL;
    }
    Py_INCREF(owner_var);
    Py_INCREF(current_owner);
    Py_INCREF(no_fences);
    Py_INCREF(state_open);
    Py_INCREF(state_ended);
    if (!PyType_IsSubtype(t_opened, t_request)) {
        PyErr_SetString(PyExc_TypeError, "configure(): the opened type must be a request");
        return NULL;
    }
    /* Every slot written or read, by class: its offset from the member descriptor. */
    const struct { PyTypeObject *type; const char *name; Py_ssize_t *out; } slots[] = {
        {t_plan, "handle", &o_plan_handle},
        {t_plan, "spec", &o_plan_spec},
        {t_plan, "where", &o_plan_where},
        {t_plan, "mode", &o_plan_mode},
        {t_plan, "write", &o_plan_write},
        {t_plan, "lease", &o_plan_lease},
        {t_spec, "storage", &o_spec_storage},
        {t_queue, "_lock", &o_q_lock},
        {t_queue, "_entries", &o_q_entries},
        {t_queue, "has_poison", &o_q_has_poison},
        {t_queue, "retired", &o_q_retired},
        {t_queue, "_tail", &o_q_tail},
        {t_queue, "_pending", &o_q_pending},
        {t_request, "_waiter", &o_r_waiter},
        {t_request, "_write", &o_r_write},
        {t_request, "fences", &o_r_fences},
        {t_request, "granted", &o_r_granted},
        {t_request, "group", &o_r_group},
        {t_request, "hi", &o_r_hi},
        {t_request, "holder", &o_r_holder},
        {t_request, "lo", &o_r_lo},
        {t_request, "mode", &o_r_mode},
        {t_request, "owner_thread", &o_r_owner},
        {t_request, "queue", &o_r_queue},
        {t_request, "released", &o_r_released},
        {t_opened, "_lock", &o_a_lock},
        {t_opened, "_primary_done", &o_a_primary_done},
        {t_opened, "_state", &o_a_state},
        {t_opened, "error", &o_a_error},
        {t_opened, "handle", &o_a_handle},
        {t_opened, "poison_range", &o_a_poison_range},
        {t_opened, "spec", &o_a_spec},
        {t_opened, "unclaimed", &o_a_unclaimed},
        {t_opened, "written", &o_a_written},
        {t_owner, "ident", &o_owner_ident},
        {t_lease, "_access", &o_lease_access},
    };
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++)
        if (offset_of(slots[i].type, slots[i].name, slots[i].out) < 0)
            return NULL;
    if ((s_acquire = PyUnicode_InternFromString("acquire")) == NULL
        || (s_release = PyUnicode_InternFromString("release")) == NULL
        || (s_access_queue = PyUnicode_InternFromString("access_queue")) == NULL
        || (s_where_for = PyUnicode_InternFromString("where_for")) == NULL
        || (s_fences_for_locked = PyUnicode_InternFromString("_fences_for_locked")) == NULL
        || (s_grant_locked = PyUnicode_InternFromString("_grant_locked")) == NULL
        || (s_wake = PyUnicode_InternFromString("_wake")) == NULL
        || (s_finish = PyUnicode_InternFromString("finish")) == NULL)
        return NULL;
    PyObject *threading = PyImport_ImportModule("_thread");
    if (threading == NULL)
        return NULL;
    PyObject *lock = PyObject_CallMethod(threading, "allocate_lock", NULL);
    Py_DECREF(threading);
    if (lock == NULL)
        return NULL;
    t_lock = Py_TYPE(lock);
    Py_INCREF(t_lock);
    Py_DECREF(lock);
    if ((lock_acquire = PyObject_GetAttrString((PyObject *)t_lock, "acquire")) == NULL
        || (lock_release = PyObject_GetAttrString((PyObject *)t_lock, "release")) == NULL)
        return NULL;
    configured = 1;
    Py_RETURN_NONE;
}

/* A queue-unit bound (a Python int) as a C integer; 0 when it is not one that fits. */
static inline int
bound(PyObject *v, long long *out)
{
    int overflow;
    if (v == NULL || !PyLong_CheckExact(v))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The owner token of the calling context (current_owner()'s result), a new reference. */
static PyObject *
owner_now(void)
{
    PyObject *owner;
    if (PyContextVar_Get(owner_var, NULL, &owner) < 0)
        return NULL;
    if (owner != NULL && Py_IS_TYPE(owner, t_owner)) {
        PyObject *ident = SLOT(owner, o_owner_ident);
        if (ident != NULL && PyLong_CheckExact(ident)) {
            unsigned long v = PyLong_AsUnsignedLong(ident);
            if (v == (unsigned long)-1 && PyErr_Occurred())
                PyErr_Clear();
            else if (v == PyThread_get_thread_ident())
                return owner;
        }
    }
    Py_XDECREF(owner);
    return PyObject_CallNoArgs(current_owner);
}

static inline int
call_lock(PyObject *lock, PyObject *name)
{
    PyObject *r;
    if (Py_IS_TYPE(lock, t_lock))
        r = PyObject_Vectorcall(name == s_acquire ? lock_acquire : lock_release, &lock, 1, NULL);
    else
        r = PyObject_CallMethodNoArgs(lock, name);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* open_lease(plan): a lease over an access granted and opened at once, or None. */
static PyObject *
open_lease(PyObject *self, PyObject *plan)
{
    if (!configured || !Py_IS_TYPE(plan, t_plan))
        Py_RETURN_NONE;
    PyObject *handle = SLOT(plan, o_plan_handle);
    PyObject *spec = SLOT(plan, o_plan_spec);
    PyObject *lease_type = SLOT(plan, o_plan_lease);
    PyObject *mode = SLOT(plan, o_plan_mode);
    PyObject *write = SLOT(plan, o_plan_write);
    if (handle == NULL || handle == Py_None || spec == NULL || !Py_IS_TYPE(spec, t_spec)
        || lease_type == NULL || !PyType_Check(lease_type)
        || !PyType_IsSubtype((PyTypeObject *)lease_type, t_lease) || mode == NULL
        || write == NULL)
        Py_RETURN_NONE;
    int is_write = write == Py_True;
    PyObject *storage = SLOT(spec, o_spec_storage);
    if (storage == NULL)
        Py_RETURN_NONE;
    /* The queue first, then the range (see queue_range). */
    PyObject *queue = PyObject_GetAttr(storage, s_access_queue);
    if (queue == NULL)
        return NULL;
    PyObject *result = NULL, *owner = NULL, *acc = NULL, *where = NULL;
    if (!Py_IS_TYPE(queue, t_queue))
        goto none;
    where = SLOT(plan, o_plan_where);
    if (where != NULL && PyTuple_CheckExact(where) && PyTuple_GET_SIZE(where) == 3
        && PyTuple_GET_ITEM(where, 0) == queue) {
        Py_INCREF(where);
    }
    else {
        where = PyObject_CallMethodOneArg(plan, s_where_for, queue);
        if (where == NULL)
            goto done;
        if (!PyTuple_CheckExact(where) || PyTuple_GET_SIZE(where) != 3)
            goto none;
    }
    PyObject *lo_obj = PyTuple_GET_ITEM(where, 1), *hi_obj = PyTuple_GET_ITEM(where, 2);
    long long lo, hi;
    if (!bound(lo_obj, &lo) || !bound(hi_obj, &hi))
        goto none;
    if (SLOT(queue, o_q_has_poison) != Py_False)
        goto none;
    if ((owner = owner_now()) == NULL)
        goto done;
    if ((acc = t_opened->tp_alloc(t_opened, 0)) == NULL)
        goto done;
    /* AccessRequest's state, as try_grant stores it. */
    put(acc, o_r_mode, mode);
    put(acc, o_r_write, is_write ? Py_True : Py_False);
    put(acc, o_r_lo, lo_obj);
    put(acc, o_r_hi, hi_obj);
    put(acc, o_r_holder, spec);
    put(acc, o_r_owner, owner);
    put(acc, o_r_granted, Py_False);
    put(acc, o_r_released, Py_False);
    put(acc, o_r_fences, no_fences);
    put(acc, o_r_queue, queue);
    put(acc, o_r_group, Py_None);
    put(acc, o_r_waiter, Py_None);

    PyObject *lock = SLOT(queue, o_q_lock);
    PyObject *entries = SLOT(queue, o_q_entries);
    if (lock == NULL || entries == NULL || !PyDict_CheckExact(entries))
        goto none;
    if (call_lock(lock, s_acquire) < 0)
        goto done;
    int granted = 0, failed = 0;
    {
        Py_ssize_t pos = 0;
        PyObject *q, *value;
        int conflict = 0;
        while (PyDict_Next(entries, &pos, &q, &value)) {
            long long qlo, qhi;
            if (!PyObject_TypeCheck(q, t_request) || !bound(SLOT(q, o_r_lo), &qlo)
                || !bound(SLOT(q, o_r_hi), &qhi)) {
                conflict = 1;  /* not ours to judge: the general path decides */
                break;
            }
            if (qlo <= hi && lo <= qhi && (is_write || SLOT(q, o_r_write) != Py_False)) {
                conflict = 1;
                break;
            }
        }
        if (!conflict && SLOT(queue, o_q_has_poison) == Py_False
            && SLOT(queue, o_q_retired) == Py_False) {
            PyObject *tail = SLOT(queue, o_q_tail);
            int fenced = 0;
            if (tail == NULL || !PyList_CheckExact(tail))
                fenced = 1;
            else if (PyList_GET_SIZE(tail)) {
                PyObject *fences = PyObject_CallMethodObjArgs(
                    queue, s_fences_for_locked, lo_obj, hi_obj,
                    is_write ? Py_True : Py_False, NULL);
                if (fences == NULL)
                    failed = 1;
                else {
                    fenced = PyObject_IsTrue(fences);
                    Py_DECREF(fences);
                    if (fenced < 0)
                        failed = 1;
                }
            }
            if (!failed && !fenced) {
                put(acc, o_r_granted, Py_True);
                if (PyDict_SetItem(entries, acc, Py_None) < 0) {
                    put(acc, o_r_granted, Py_False);
                    failed = 1;
                }
                else
                    granted = 1;
            }
        }
    }
    {
        PyObject *et = NULL, *ev = NULL, *etb = NULL;
        if (failed)
            PyErr_Fetch(&et, &ev, &etb);  /* the lock is released first, as `finally` does */
        int unlocked = call_lock(lock, s_release);
        if (failed) {
            if (unlocked < 0) {
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(etb);
            }
            else
                PyErr_Restore(et, ev, etb);
            goto done;
        }
        if (unlocked < 0)
            goto done;  /* cannot happen for a lock this thread holds */
    }
    if (!granted)
        goto none;
    /* Access.__init__'s state for an opened access (LeasePlan.open_now). */
    put(acc, o_a_spec, spec);
    put(acc, o_a_poison_range, Py_None);
    put(acc, o_a_written, spec);
    put(acc, o_a_handle, handle);
    put(acc, o_a_state, state_open);
    put(acc, o_a_primary_done, Py_False);
    put(acc, o_a_unclaimed, Py_False);
    put(acc, o_a_lock, Py_None);
    put(acc, o_a_error, Py_None);
    PyTypeObject *lt = (PyTypeObject *)lease_type;
    PyObject *lease = lt->tp_alloc(lt, 0);
    if (lease == NULL) {
        /* Out of memory with the grant made: end the access as finish() would, with the
         * MemoryError kept aside meanwhile (Python code must not run with it set). */
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *r = PyObject_CallMethodNoArgs(acc, s_finish);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        PyErr_Restore(et, ev, etb);
        goto done;
    }
    put(lease, o_lease_access, acc);
    result = lease;
    goto done;
none:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(acc);
    Py_XDECREF(owner);
    Py_XDECREF(where);
    Py_DECREF(queue);
    return result;
}

/* finish_access(access): Access.finish(access) with no failure and no fence. */
static PyObject *
finish_access(PyObject *self, PyObject *acc)
{
    if (!configured || !Py_IS_TYPE(acc, t_opened))
        return PyObject_CallMethodNoArgs(acc, s_finish);
    PyObject *done = SLOT(acc, o_a_primary_done);
    if (done == Py_True)
        Py_RETURN_NONE;
    PyObject *queue = SLOT(acc, o_r_queue);
    if (done != Py_False || SLOT(acc, o_a_lock) != Py_None || queue == NULL
        || !Py_IS_TYPE(queue, t_queue) || SLOT(queue, o_q_has_poison) != Py_False
        || SLOT(acc, o_r_granted) != Py_True)
        return PyObject_CallMethodNoArgs(acc, s_finish);
    PyObject *lock = SLOT(queue, o_q_lock);
    PyObject *entries = SLOT(queue, o_q_entries);
    PyObject *pending = SLOT(queue, o_q_pending);
    if (lock == NULL || entries == NULL || !PyDict_CheckExact(entries) || pending == NULL)
        return PyObject_CallMethodNoArgs(acc, s_finish);
    /* Access.finish's success on plain memory, then AccessQueue.release(acc, None). */
    put(acc, o_a_primary_done, Py_True);
    put(acc, o_a_state, state_ended);
    if (SLOT(acc, o_r_released) == Py_True)
        Py_RETURN_NONE;
    Py_INCREF(queue);
    PyObject *woken = NULL;
    int failed = 0;
    if (call_lock(lock, s_acquire) < 0) {
        Py_DECREF(queue);
        return NULL;
    }
    if (SLOT(acc, o_r_released) != Py_True) {
        put(acc, o_r_released, Py_True);
        if (PyDict_DelItem(entries, acc) < 0) {
            if (PyErr_ExceptionMatches(PyExc_KeyError))
                PyErr_Clear();  /* an empty range, never queued */
            else
                failed = 1;
        }
        else {
            pending = SLOT(queue, o_q_pending);
            int any;
            if (pending == NULL) {
                PyErr_SetString(PyExc_AttributeError, "AccessQueue._pending is unset");
                any = -1;
            }
            else
                any = PyObject_IsTrue(pending);
            if (any < 0)
                failed = 1;
            else if (any && (woken = PyObject_CallMethodNoArgs(queue, s_grant_locked)) == NULL)
                failed = 1;
        }
    }
    PyObject *et = NULL, *ev = NULL, *etb = NULL;
    if (failed)
        PyErr_Fetch(&et, &ev, &etb);  /* the lock is released first, as `finally` does */
    if (call_lock(lock, s_release) < 0) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        Py_XDECREF(woken);
        Py_DECREF(queue);
        return NULL;
    }
    if (failed) {
        PyErr_Restore(et, ev, etb);
        Py_XDECREF(woken);
        Py_DECREF(queue);
        return NULL;
    }
    if (woken != NULL) {
        PyObject *r = PyObject_CallMethodOneArg(queue, s_wake, woken);
        Py_DECREF(woken);
        if (r == NULL) {
            Py_DECREF(queue);
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_DECREF(queue);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(plan, spec, queue, request, opened, owner, lease, owner_var, current_owner, "
     "no_fences, open, ended): the classes and objects of uni._access (once)."},
    {"open_lease", open_lease, METH_O,
     "open_lease(plan): a lease over an access granted and opened at once, or None."},
    {"finish_access", finish_access, METH_O,
     "finish_access(access): Access.finish(access), with the plain success case in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "uni._fastlease",
    "The uncontended host lease in C (a twin of uni._access.open_lease_py).", -1, methods,
};

/* What this build was written against: uni/_access.py checks it (FASTLEASE_VERSION) and
 * uses the Python code when a stale build (the .so is not rebuilt by editing Python) differs.
 * Raise both together whenever open_now, try_grant, finish or release change. */
#define FASTLEASE_VERSION 1

PyMODINIT_FUNC
PyInit__fastlease(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", FASTLEASE_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
