"""The numeric core of the ``blas`` backend: gemm and gemv on numpy strided views.

The routines call a Fortran-ABI OpenBLAS directly, by address, so that every operand BLAS can
address is passed in place (a padded leading dimension, a transposed view) and everything
else is declined, never copied. scipy's f2py wrappers (``scipy.linalg.blas.dgemm``) are not
used because they silently copy any operand that is not contiguous.

Two libraries are tried, in this order (``_load``; ``library()`` says which one is in use):

1. numpy's own OpenBLAS, the one ``numpy.matmul`` calls, so that uni's gemm costs what numpy's
   BLAS costs on this machine. numpy's wheels link ``scipy_openblas64`` (symbols
   ``scipy_?gemm_64_``; numpy 1.26's ``openblas64_`` has ``?gemm_64_``); the symbols are found
   with dlsym on numpy's ``_multiarray_umath`` extension, whose lookup also searches the
   libraries it links. Every integer argument is passed as an ``int64 *``. An LP64 library
   handed those would read their low 32 bits, which are right for values below 2**31 on a
   little-endian machine, so no self-test could tell the two apart: the 64-bit limit is only
   trusted when the library's own configuration string (``openblas_get_config64_``; numpy's
   ``show_config`` where it has none) says ``USE64BITINT``, and is 2**31 - 1 otherwise.
2. scipy's OpenBLAS (``scipy_openblas32``, LP64), through the function pointers that
   ``scipy.linalg.cython_blas`` exports as PyCapsules; where numpy has no such library
   (macOS wheels use Accelerate; a numpy built against a system BLAS). Each capsule's name
   is the C signature of the exported function and is parsed to confirm ``int *`` (32-bit)
   integers and exactly the 13 (gemm) / 11 (gemv) documented arguments.

Facts about the ABI that both rely on:

- OpenBLAS's Fortran-ABI entry points (``interface/gemm.c``, ``interface/gemv.c``) are C
  functions taking exactly the documented pointer arguments, integers as ``blasint *``
  (64-bit in an ILP64 build), with no hidden Fortran string-length arguments; scipy's
  capsules point at Cython wrappers with the same arguments that forward to them.
- ``ctypes.CFUNCTYPE`` releases the GIL for the duration of a call, so independent calls from
  several threads run concurrently.
- A library is used only after a self-test (``_self_test``) gives exact answers through the
  very call path the backend uses; if numpy's fails, scipy's is tried; if both fail, the
  backend reports UNAVAILABLE.

Edge rules (SPEC §5) are enforced here rather than left to the BLAS build, because BLAS
builds have differed on them across versions (e.g. OpenBLAS 0.3.27 made ?scal with a zero
factor propagate NaN, and its gemv applies beta through ?scal):

- ``beta == 0`` never reads the output: it is zero-filled first and BLAS then runs with
  ``beta = 1``, which is the same single pass over the output that BLAS would make itself.
- ``alpha == 0`` or ``k == 0``: the output becomes ``beta * output`` by numpy, and BLAS (which
  would read the inputs) is not called.
- An empty output succeeds at once.
"""

from __future__ import annotations

import ctypes
import importlib
import struct
import threading
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt

from uni._address import data_address
from uni._mapping import nests, reach
from uni._probe import Decline
from uni.backends._geometry import plan_gemm, plan_gemv

__all__ = ["Library", "available", "gemm", "gemm_batched", "gemv", "gemv_batched", "library",
           "gemm_form", "gemv_form", "prepare_gemm", "prepare_gemv"]

Array: TypeAlias = npt.NDArray[Any]
Scalar: TypeAlias = "int | float | complex | np.number[Any]"

# Extents, leading dimensions and increments must fit the library's BLAS integer.
_INT32_MAX: Final = 2**31 - 1
_INT64_MAX: Final = 2**63 - 1

# Every argument of a Fortran-ABI routine is passed by pointer; the pointers travel as plain
# integers through c_void_p, which is the cheapest conversion ctypes offers.
_VP = ctypes.c_void_p
_GemmFn: TypeAlias = Callable[..., None]
_GEMM_PROTO: Final = ctypes.CFUNCTYPE(None, *([_VP] * 13))
_GEMV_PROTO: Final = ctypes.CFUNCTYPE(None, *([_VP] * 11))

# Transpose flags are read-only for BLAS, so one shared object per flag is safe across threads.
_N_CHAR: Final = ctypes.c_char(b"N")
_T_CHAR: Final = ctypes.c_char(b"T")
_C_CHAR: Final = ctypes.c_char(b"C")
_N: Final = ctypes.addressof(_N_CHAR)
_T: Final = ctypes.addressof(_T_CHAR)
_C: Final = ctypes.addressof(_C_CHAR)



@attrs.frozen
class Library:
    """Which BLAS the backend calls: the package that ships it, how its routines are reached
    (``symbols`` with ``{}`` for the routine, e.g. ``dgemm``), the width of the integers
    passed to it and the largest value they may hold (2**31 - 1 unless the library is known
    to be ILP64)."""

    package: str = attrs.field(validator=attrs.validators.in_(("numpy", "scipy")))
    symbols: str
    int_bits: int = attrs.field(validator=attrs.validators.in_((32, 64)))
    int_max: int = attrs.field(validator=attrs.validators.in_((_INT32_MAX, _INT64_MAX)))

    @int_max.validator
    def _fits(self, _attribute: object, value: int) -> None:
        if value >= 2 ** (self.int_bits - 1):
            raise ValueError(f"int_max {value} does not fit {self.int_bits}-bit integers")


def _address(fn: Any) -> int:
    """The address of the routine behind a ctypes function object."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


# Plans (trans flags, BLAS integers) depend only on shapes and strides, and (alpha, beta) pairs
# repeat; both are cached per dtype so a small call costs a dict lookup, not a re-derivation.
# The cached ctypes buffers are only ever read by BLAS, so threads may share them. The caches are
# cleared, not evicted, when full: that bounds memory at no bookkeeping cost per call.
_CACHE_MAX: Final = 512


class _Kind:
    """Per-dtype BLAS entry points, scalar layout and caches."""

    __slots__ = ("align_mask", "beta_zero_ignores_c", "dtype", "gemm", "gemm_plans", "gemv", "gemv_plans",
                 "int_max", "int_offsets", "int_type", "is_complex", "itemsize", "scalar_cache",
                 "scalars")

    def __init__(
        self, dtype: np.dtype[Any], gemm: _GemmFn, gemv: _GemmFn,
        scalars: type[ctypes.Array[Any]], int_type: type[ctypes.c_int | ctypes.c_int64],
        int_max: int,
    ) -> None:
        self.dtype = dtype
        self.gemm = gemm
        self.gemv = gemv
        # The library's BLAS integer: plans are built in it, and byte offsets 0..5 address the
        # 1st..6th integer of a plan's buffer.
        self.int_type = int_type
        self.int_offsets = tuple(i * ctypes.sizeof(int_type) for i in range(6))
        self.int_max = int_max
        self.beta_zero_ignores_c: bool | None = None
        self.is_complex = dtype.kind == "c"
        self.itemsize = dtype.itemsize
        # Strides are checked to be itemsize multiples, so numpy's alignment of the data
        # pointer alone decides whether every element is aligned.
        self.align_mask = dtype.alignment - 1
        self.scalars = scalars
        self.scalar_cache: dict[object, _ScalarEntry] = {}
        self.gemm_plans: dict[object, _GemmPlan | Decline] = {}
        self.gemv_plans: dict[object, _GemvPlan | Decline] = {}


# (buffer, &alpha, &beta, alpha, beta); the buffer's beta is 1 where beta == 0, because the
# output is then zero-filled before BLAS accumulates into it.
_ScalarEntry: TypeAlias = tuple["ctypes.Array[Any]", int, int, complex, complex]
# (fn, swap, trans1, trans2, ints, &M, &N, &K, &ld1, &ld2, &ldc, span_a, span_b, span_c);
# swap: b is BLAS's first operand (row-major c). Spans are byte extents from the first element.
_GemmPlan: TypeAlias = tuple[
    _GemmFn, bool, int, int, "ctypes.Array[Any]", int, int, int, int, int, int,
    int, int, int,
]
# (fn, trans, ints, &M, &N, &lda, &incx, &incy, x_offset, y_offset, span_a, span_x, span_y);
# the offsets move a negative-increment vector's pointer to its lowest address.
_GemvPlan: TypeAlias = tuple[
    _GemmFn, int, "ctypes.Array[Any]", int, int, int, int, int, int, int, int, int, int,
]


def _remember(cache: dict[object, Any], key: object, value: object) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value


# dtype -> _Kind once loaded; an empty dict means no BLAS could be loaded (UNAVAILABLE).
_kinds: dict[np.dtype[Any], _Kind] | None = None
_library: Library | None = None
_load_lock = threading.Lock()

_LETTERS: Final[dict[str, tuple[np.dtype[Any], type[ctypes.Array[Any]]]]] = {
    "s": (np.dtype(np.float32), ctypes.c_float * 2),
    "d": (np.dtype(np.float64), ctypes.c_double * 2),
    "c": (np.dtype(np.complex64), ctypes.c_float * 4),
    "z": (np.dtype(np.complex128), ctypes.c_double * 4),
}
# How the element type appears in a capsule's signature: Cython spells cython_blas.pxd's
# typedefs s/d as <module prefix>_s / _d, and c/z (float/double complex) as its own
# __pyx_t_float_complex / __pyx_t_double_complex; either spelling is accepted for each.
_ELEMENT_SUFFIXES: Final = {
    "s": ("_s *",),
    "d": ("_d *",),
    "c": ("_c *", "_float_complex *"),
    "z": ("_z *", "_double_complex *"),
}
# Signatures expected from cython_blas; "T" marks the scalar/array element type.
_GEMM_SIG: Final = ("char", "char", "int", "int", "int", "T", "T", "int", "T", "int", "T", "T",
                    "int")
_GEMV_SIG: Final = ("char", "int", "int", "T", "T", "int", "T", "int", "T", "T", "int")


def _signature_ok(signature: str, letter: str, expected: tuple[str, ...]) -> bool:
    """Check a capsule's C signature, e.g. ``void (char *, int *, ..., __pyx_t_..._d *)``.

    ``int *`` at every integer position is what makes the library LP64; an ILP64 build would
    show a 64-bit integer type there, and passing 32-bit ints to it would be wrong.
    """
    if not signature.startswith("void (") or not signature.endswith(")"):
        return False
    params = [p.strip() for p in signature[len("void ("):-1].split(",")]
    if len(params) != len(expected):
        return False
    for param, want in zip(params, expected, strict=True):
        if want == "T":
            if not param.endswith(_ELEMENT_SUFFIXES[letter]):
                return False
        elif param != f"{want} *":
            return False
    return True


def _load() -> dict[np.dtype[Any], _Kind]:
    global _kinds, _library
    with _load_lock:
        if _kinds is not None:
            return _kinds
        for source in _SOURCES:
            loaded = _load_source(source)
            if loaded is not None:
                _library, _kinds = loaded
                return _kinds
        _kinds = {}
        return _kinds


# numpy's first: it is the library numpy.matmul calls, which is what uni's gemm is compared with.
_SOURCES: Final = ("numpy", "scipy")


def _load_source(source: str) -> tuple[Library, dict[np.dtype[Any], _Kind]] | None:
    """One source's library and entry points, self-tested; None when it is absent or fails."""
    loader = _load_numpy if source == "numpy" else _load_scipy
    try:
        loaded = loader()
    except (ImportError, KeyError, AttributeError, TypeError, ValueError, OSError):
        # Absent library, a build without these symbols or capsules, an unexpected config.
        return None
    if loaded is None or not _self_test(loaded[1]):
        return None
    return loaded


# numpy's OpenBLAS symbol spellings: scipy_openblas64 (numpy >= 2.0), openblas64_ (numpy 1.26).
_NUMPY_SYMBOLS: Final = ("scipy_{}_64_", "{}_64_")
_NUMPY_EXTENSIONS: Final = ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath")


def _numpy_blas_is_ilp64(handle: ctypes.CDLL, symbols: str) -> bool:
    """Whether numpy's OpenBLAS says it was built with 64-bit integers.

    Asked of the library itself (``openblas_get_config``, with the symbols' prefix and the
    ``64_`` suffix) and, where it has no such entry, of numpy's build configuration; anything
    unreadable counts as no (the 32-bit limit, which is right for either kind of library).
    """
    prefix = symbols.split("{}")[0]
    try:
        get_config = getattr(handle, f"{prefix}openblas_get_config64_")
    except AttributeError:
        get_config = None
    if get_config is not None:
        get_config.restype = ctypes.c_char_p
        get_config.argtypes = []
        text: bytes | None = get_config()
        return b"USE64BITINT" in (text or b"").split()
    try:
        config: Any = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return "USE64BITINT" in str(blas.get("openblas configuration", "")).split()
    except (KeyError, TypeError, AttributeError):
        return False


def _load_numpy() -> tuple[Library, dict[np.dtype[Any], _Kind]] | None:
    extension = None
    for name in _NUMPY_EXTENSIONS:
        try:
            extension = importlib.import_module(name)
            break
        except ImportError:
            continue
    if extension is None:
        return None
    # dlsym on the extension's handle also searches the libraries it links, numpy's BLAS too.
    handle = ctypes.CDLL(extension.__file__)
    for symbols in _NUMPY_SYMBOLS:
        if hasattr(handle, symbols.format("dgemm")):
            break
    else:
        return None
    int_max = _INT64_MAX if _numpy_blas_is_ilp64(handle, symbols) else _INT32_MAX
    library = Library("numpy", symbols, 64, int_max)

    def address(routine: str) -> int:
        pointer = _address(getattr(handle, symbols.format(routine)))
        if not pointer:
            raise AttributeError(symbols.format(routine))
        return pointer

    kinds: dict[np.dtype[Any], _Kind] = {}
    for letter, (dtype, scalars) in _LETTERS.items():
        kinds[dtype] = _Kind(dtype, _GEMM_PROTO(address(letter + "gemm")),
                             _GEMV_PROTO(address(letter + "gemv")), scalars, ctypes.c_int64,
                             int_max)
    return library, kinds


def _load_scipy() -> tuple[Library, dict[np.dtype[Any], _Kind]] | None:
    # Imported only when numpy's BLAS is unusable: scipy is then the one that provides BLAS.
    from scipy.linalg import cython_blas

    capi: dict[str, object] = cython_blas.__pyx_capi__
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
        ("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))

    def entry(name: str, letter: str, expected: tuple[str, ...], proto: Any) -> _GemmFn | None:
        capsule = capi[name]
        raw_name: bytes | None = get_name(capsule)
        if raw_name is None or not _signature_ok(raw_name.decode(), letter, expected):
            return None
        address: int | None = get_pointer(capsule, raw_name)
        if not address:
            return None
        fn: _GemmFn = proto(address)
        return fn

    kinds: dict[np.dtype[Any], _Kind] = {}
    for letter, (dtype, scalars) in _LETTERS.items():
        gemm_fn = entry(letter + "gemm", letter, _GEMM_SIG, _GEMM_PROTO)
        gemv_fn = entry(letter + "gemv", letter, _GEMV_SIG, _GEMV_PROTO)
        if gemm_fn is None or gemv_fn is None:
            return None
        kinds[dtype] = _Kind(dtype, gemm_fn, gemv_fn, scalars, ctypes.c_int, _INT32_MAX)
    return Library("scipy", "scipy.linalg.cython_blas.{}", 32, _INT32_MAX), kinds


def _self_test(kinds: dict[np.dtype[Any], _Kind]) -> bool:
    """Run one tiny gemm and gemv per dtype through the raw pointers and compare with numpy.

    The signature check cannot see calling-convention mistakes (scalar layout, argument order,
    the negative-increment convention); a wrong answer here makes the backend report
    UNAVAILABLE instead of computing garbage. Small integers keep every product exact.
    """
    for dtype, kind in kinds.items():
        values = np.arange(1, 25, dtype=np.float64)
        if kind.is_complex:
            values = values + 1j * values[::-1]
        base = values.astype(dtype).reshape(4, 6)
        alpha: complex = 2 - 1j if kind.is_complex else 2
        a = base[:3, :2]  # row-major, padded leading dimension 6 -> 'T'
        b = np.asfortranarray(base[:2, 1:4] - 2)  # column-major -> 'N'
        c = np.ones((3, 3), dtype=dtype, order="F")
        want = alpha * (a @ b) + 3 * c
        if _gemm(kinds, a, b, c, alpha, 3, False, False) is not None:
            return False
        if not np.array_equal(c, want):
            return False
        x = base[0, ::-2][:2]  # negative increment: BLAS must get the lowest address
        y = np.ones(3, dtype=dtype)
        want_y = alpha * (a @ x) + 3 * y
        if _gemv(kinds, a, x, y, alpha, 3, False) is not None:
            return False
        if not np.array_equal(y, want_y):
            return False
    return True


def available() -> bool:
    """Whether a BLAS (numpy's or scipy's) could be loaded and passed its self-test."""
    kinds = _kinds if _kinds is not None else _load()
    return bool(kinds)


def library() -> Library | None:
    """The BLAS the backend calls (loading it on first use); None when none could be loaded."""
    if _kinds is None:
        _load()
    return _library


_SCALAR_TYPES: Final = (int, float, complex, np.number)


def _make_scalars(kind: _Kind, alpha: object, beta: object) -> _ScalarEntry | None:
    if not isinstance(alpha, _SCALAR_TYPES) or not isinstance(beta, _SCALAR_TYPES):
        return None
    try:
        al = complex(alpha)
        be = complex(beta)
    except OverflowError:  # a Python int beyond double range: not a BLAS scalar
        return None
    run_beta = 1 if be == 0 else be
    if kind.is_complex:
        buf = kind.scalars(al.real, al.imag, run_beta.real, run_beta.imag)
    elif al.imag or be.imag:
        # A complex scalar with a real output has no real BLAS routine to run.
        return None
    else:
        buf = kind.scalars(al.real, run_beta.real)
    address = ctypes.addressof(buf)
    return buf, address, address + ctypes.sizeof(buf) // 2, al, be


def _scalar_entry(kind: _Kind, alpha: object, beta: object) -> _ScalarEntry | None:
    """The (alpha, beta) pair in the routine's precision, or None if it cannot be expressed.

    Keys compare by value, so 2, 2.0 and np.float64(2) share an entry; that is sound because
    equal values convert to the same BLAS scalars.
    """
    key = (alpha, beta)
    cache = kind.scalar_cache
    try:
        entry = cache.get(key)
    except TypeError:  # unhashable: not a scalar uni accepts
        return None
    if entry is None:
        entry = _make_scalars(kind, alpha, beta)
        if entry is not None:
            _remember(cache, key, entry)
    return entry


def _span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """Bytes from the first element to past the last, for a view with non-negative strides."""
    return reach(shape, strides)[1] + itemsize


# Bound on the exact overlap solver's work (numpy's stubs only admit its -1/0 sentinels).
_OVERLAP_WORK: Any = 100_000


def _overlaps(out: Array, other: Array) -> bool:
    """Whether the output shares memory with an input (BLAS would read what it has written).

    Called once bounds already intersect: the exact test tells interleaved-but-disjoint views
    (e.g. column blocks of one padded buffer) apart from real overlap. A problem too hard to
    decide counts as overlapping.
    """
    try:
        return bool(np.shares_memory(out, other, max_work=_OVERLAP_WORK))
    except np.exceptions.TooHardError:
        return True


def _scale(out: Array, beta: complex) -> None:
    """``out = beta * out`` without BLAS; beta == 0 writes zeros without reading ``out``."""
    if beta == 0:
        out.fill(0)
    elif beta != 1:
        # BLAS would not warn on overflow; numpy would, and warnings may be errors.
        with np.errstate(all="ignore"):
            np.multiply(out, beta if out.dtype.kind == "c" else beta.real, out=out)


# ---------------------------------------------------------------------------------------------
# gemm
# ---------------------------------------------------------------------------------------------


def _element_strides(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
                     ) -> tuple[int, ...] | None:
    """Byte strides as element strides; None when one that matters is not a multiple of the
    itemsize. The stride of an axis of extent <= 1 never selects an element: it becomes 0."""
    out = []
    for extent, stride in zip(shape, strides, strict=True):
        if extent <= 1:
            out.append(0)
            continue
        q, rem = divmod(stride, itemsize)
        if rem:
            return None
        out.append(q)
    return tuple(out)


_FLAGS: Final = {"N": _N, "T": _T, "C": _C}


def _plan_gemm(
    kind: _Kind, a_shape: tuple[int, ...], a_strides: tuple[int, ...],
    b_shape: tuple[int, ...], b_strides: tuple[int, ...], c_shape: tuple[int, ...],
    c_strides: tuple[int, ...], conj_a: bool, conj_b: bool,
) -> _GemmPlan | Decline:
    """The shared geometry (``uni.backends._geometry``) in Fortran-ABI form: flag and int
    addresses, plus the byte spans the overlap checks need. Depends only on geometry, so its
    answer (a plan or a Decline) is cacheable."""
    isz = kind.itemsize
    m, k = a_shape
    n = b_shape[1]
    strides = [_element_strides(sh, st, isz) for sh, st in
               ((a_shape, a_strides), (b_shape, b_strides), (c_shape, c_strides))]
    if strides[2] is None or (k and (strides[0] is None or strides[1] is None)):
        return Decline.UNSUPPORTED_LAYOUT
    if max(m, n, k) > kind.int_max:
        return Decline.UNSUPPORTED_SHAPE
    ea, eb, ec = (st or (0, 0) for st in strides)
    geometry = plan_gemm((m, k), (ea[0], ea[1]), (k, n), (eb[0], eb[1]), (m, n),
                         (ec[0], ec[1]), conj_a and kind.is_complex, conj_b and kind.is_complex)
    if isinstance(geometry, Decline):
        return geometry
    g = geometry
    if max(g.ld_first, g.ld_second, g.ldc) > kind.int_max:
        return Decline.UNSUPPORTED_LAYOUT
    ints = (kind.int_type * 6)(g.m, g.n, g.k, g.ld_first, g.ld_second, g.ldc)
    p = ctypes.addressof(ints)
    _, i1, i2, i3, i4, i5 = kind.int_offsets
    span_c = _span(c_shape, c_strides, isz)
    if k == 0:
        return kind.gemm, g.swap, _N, _N, ints, p, p, p, p, p, p, 0, 0, span_c
    return (kind.gemm, g.swap, _FLAGS[g.trans_first], _FLAGS[g.trans_second], ints, p,
            p + i1, p + i2, p + i3, p + i4, p + i5, _span(a_shape, a_strides, isz),
            _span(b_shape, b_strides, isz), span_c)


def gemm(
    a: Array, b: Array, c: Array, alpha: Scalar = 1.0, beta: Scalar = 0.0, *,
    conj_a: bool = False, conj_b: bool = False,
) -> Decline | None:
    """``c <- alpha * op(a) @ op(b) + beta * c`` on 2-D numpy views, in place, through BLAS.

    ``conj_a``/``conj_b`` mean the operand is logically conjugated (the view holds the
    unconjugated values; ignored for real dtypes). Returns None on success, or a Decline having
    touched nothing when BLAS cannot address the operands without a temporary copy:

    - UNAVAILABLE: no BLAS (numpy's or scipy's) could be loaded.
    - UNSUPPORTED_INSTANCE: not numpy arrays, mixed or unsupported dtypes (non-native byte
      order included), read-only c, a non-numeric or (for a real dtype) complex scalar, or c
      sharing memory with a or b.
    - UNSUPPORTED_SHAPE: not 2-D, or an extent beyond the library's BLAS integers (``library()``).
    - UNSUPPORTED_LAYOUT: an operand with no unit-stride axis plus a legal leading dimension
      (negative or zero strides, steps on both axes, strides not a multiple of the itemsize),
      a leading dimension beyond the library's BLAS integers, or a misaligned operand.
    - UNSUPPORTED_ACCESSOR: a conjugate BLAS cannot express (only 'C' = conjugate-transpose
      exists, so a conjugated operand must be stored transposed relative to c's order).

    Operands with no elements are not inspected; an empty c succeeds at once. Mismatched
    shapes are a caller error and raise ValueError.
    """
    kinds = _kinds if _kinds is not None else _load()
    return _gemm(kinds, a, b, c, alpha, beta, conj_a, conj_b)


def _scale_only(out: Array, address: int, mask: int, beta: complex) -> Decline | None:
    """The empty-product edge rule (alpha == 0 or an empty inner dimension): out = beta * out,
    the inputs never read; declined, untouched, when ``out`` is misaligned like any operand."""
    if address & mask:
        return Decline.UNSUPPORTED_LAYOUT
    _scale(out, beta)
    return None


def _kind_for(kinds: dict[np.dtype[Any], _Kind], out: object, *inputs: object) -> _Kind | Decline:
    """The per-dtype entry points for numpy operands of one supported dtype, or why not."""
    if not kinds:
        return Decline.UNAVAILABLE
    if not (isinstance(out, np.ndarray) and all(isinstance(x, np.ndarray) for x in inputs)):
        return Decline.UNSUPPORTED_INSTANCE
    kind = kinds.get(out.dtype)
    if kind is None or any(x.dtype != out.dtype for x in inputs):  # type: ignore[attr-defined]
        return Decline.UNSUPPORTED_INSTANCE
    return kind


def _gemm(
    kinds: dict[np.dtype[Any], _Kind], a: Array, b: Array, c: Array, alpha: Scalar,
    beta: Scalar, conj_a: bool, conj_b: bool,
) -> Decline | None:
    kind = _kind_for(kinds, c, a, b)
    if isinstance(kind, Decline):
        return kind
    a_shape = a.shape
    b_shape = b.shape
    c_shape = c.shape
    if len(a_shape) != 2 or len(b_shape) != 2 or len(c_shape) != 2:
        return Decline.UNSUPPORTED_SHAPE
    m, k = a_shape
    n = b_shape[1]
    if b_shape[0] != k or c_shape != (m, n):
        raise ValueError(f"gemm shapes do not match: a {a_shape}, b {b_shape}, c {c_shape}")
    if not c.flags.writeable:
        return Decline.UNSUPPORTED_INSTANCE
    scalars = _scalar_entry(kind, alpha, beta)
    if scalars is None:
        return Decline.UNSUPPORTED_INSTANCE
    if m == 0 or n == 0:
        return None
    a_strides = a.strides
    b_strides = b.strides
    c_strides = c.strides
    key = (a_shape, a_strides, b_shape, b_strides, c_strides, conj_a, conj_b)
    plan = kind.gemm_plans.get(key)
    if plan is None:
        plan = _plan_gemm(kind, a_shape, a_strides, b_shape, b_strides, c_shape, c_strides,
                          conj_a, conj_b)
        _remember(kind.gemm_plans, key, plan)
    if isinstance(plan, Decline):
        return plan
    _, p_alpha, p_beta, al, be = scalars
    fn, swap, t1, t2, _, pm, pn, pk, pl1, pl2, plc, span_a, span_b, span_c = plan
    mask = kind.align_mask
    dc = data_address(c)
    if k == 0 or al == 0:
        return _scale_only(c, dc, mask, be)
    da = data_address(a)
    db = data_address(b)
    if (da | db | dc) & mask:
        return Decline.UNSUPPORTED_LAYOUT
    # Byte ranges first (cheap); the exact test only when they intersect.
    if (da < dc + span_c and dc < da + span_a and _overlaps(c, a)) or (
        db < dc + span_c and dc < db + span_b and _overlaps(c, b)
    ):
        return Decline.UNSUPPORTED_INSTANCE
    if be == 0:
        c.fill(0)
    if swap:
        fn(t1, t2, pm, pn, pk, p_alpha, db, pl1, da, pl2, p_beta, dc, plc)
    else:
        fn(t1, t2, pm, pn, pk, p_alpha, da, pl1, db, pl2, p_beta, dc, plc)
    return None


def _beta_zero_ignores_c(kind: _Kind) -> bool:
    """Does this BLAS overwrite c when beta == 0 (NaN in c ignored)? Checked once per kind."""
    known = kind.beta_zero_ignores_c
    if known is None:
        a = np.ones((3, 3), dtype=kind.dtype, order="F")
        c = np.full((3, 3), np.nan, dtype=kind.dtype, order="F")
        ints = (kind.int_type * 4)(3, 3, 3, 3)
        base = ctypes.addressof(ints)
        _, i1, i2, i3, _, _ = kind.int_offsets
        one = kind.scalars(*([1.0, 0.0, 0.0, 0.0] if kind.is_complex else [1.0, 0.0]))
        p_one = ctypes.addressof(one)
        kind.gemm(_N, _N, base, base + i1, base + i2, p_one, data_address(a), base + i3, data_address(a),
                  base + i3, p_one + ctypes.sizeof(one) // 2, data_address(c), base + i3)
        known = kind.beta_zero_ignores_c = bool(np.all(c == 3))
    return known


def prepare_gemm(
    a: Array, b: Array, c: Array, *, conj_a: bool = False, conj_b: bool = False,
) -> Callable[[Scalar, Scalar], bool] | None:
    """A pre-planned gemm on these exact views, for callers that repeat one small product.

    Everything that depends only on the operands (plan, data pointers, alignment, overlap) is
    decided once; the returned ``run(alpha, beta)`` only converts the scalars and calls BLAS.
    ``run`` returns False, having touched nothing, for what it does not cover (alpha == 0 or
    scalars it cannot express): the caller then takes the general path. None when the views
    are not a plain, non-empty, BLAS-addressable product.
    """
    bind = gemm_form(a, b, c, conj_a=conj_a, conj_b=conj_b)
    if bind is None or _overlaps(c, a) or _overlaps(c, b):
        return None
    return bind(data_address(a), data_address(b), data_address(c))


def gemm_form(
    a: Array, b: Array, c: Array, *, conj_a: bool = False, conj_b: bool = False,
) -> Callable[[int, int, int], Callable[[Scalar, Scalar], bool] | None] | None:
    """``prepare_gemm`` for any memory laid out as these views: ``bind(da, db, dc)`` (the
    addresses of the operands' first elements, which the caller knows not to overlap) makes
    the run, or None when an address is misaligned. Everything but the addresses (the plan,
    the packed scalars) is worked out here, once."""
    kinds = _kinds if _kinds is not None else _load()
    if not kinds or not all(isinstance(x, np.ndarray) and x.ndim == 2 for x in (a, b, c)):
        return None
    kind = kinds.get(c.dtype)
    if kind is None or a.dtype != c.dtype or b.dtype != c.dtype or not c.flags.writeable:
        return None
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k or c.shape != (m, n) or 0 in (m, n, k):
        return None
    plan = _plan_gemm(kind, a.shape, a.strides, b.shape, b.strides, c.shape, c.strides,
                      conj_a, conj_b)
    if isinstance(plan, Decline):
        return None
    # The plan's ints array owns the memory pm..plc point into: the closures keep it alive.
    fn, swap, t1, t2, ints, pm, pn, pk, pl1, pl2, plc, _sa, _sb, _sc = plan
    direct_beta0 = _beta_zero_ignores_c(kind)
    mask = kind.align_mask
    raw = _raw_gemm(fn)
    address = _address(fn)
    # Per (alpha, beta): the scalars' buffer and its two addresses, or None (not covered),
    # shared by every binding of this form.
    scalar_cache: dict[object, tuple[ctypes.Array[Any], int, int] | None] = {}

    def scalars_for(alpha: Scalar, beta: Scalar) -> tuple[ctypes.Array[Any], int, int] | None:
        key = (type(alpha), alpha, type(beta), beta)
        try:
            return scalar_cache[key]
        except KeyError:
            pass
        except TypeError:
            return None
        found: tuple[ctypes.Array[Any], int, int] | None
        entry = _make_scalars(kind, alpha, beta)
        if entry is None or entry[3] == 0:
            found = None  # alpha == 0 never reads a or b: the general path handles it
        elif entry[4] == 0 and direct_beta0:
            # This BLAS is known (checked once per dtype) to overwrite c when beta == 0.
            al = entry[3]
            buf = (kind.scalars(al.real, al.imag, 0.0, 0.0) if kind.is_complex
                   else kind.scalars(al.real, 0.0))
            addr = ctypes.addressof(buf)
            found = buf, addr, addr + ctypes.sizeof(buf) // 2
        elif entry[4] == 0:
            found = None
        else:
            found = entry[0], entry[1], entry[2]
        if len(scalar_cache) > 64:
            scalar_cache.clear()
        scalar_cache[key] = found
        return found

    def bind(da: int, db: int, dc: int) -> Callable[[Scalar, Scalar], bool] | None:
        if (da | db | dc) & mask:
            return None
        first, second = (db, da) if swap else (da, db)
        # Per scalars buffer (its address), the packed arguments, kept with that buffer: a
        # buffer the form's cache let go stays alive here, so no address is reused under a
        # pack.
        packs: dict[int, tuple[tuple[int, ...], bytes, object]] = {}
        # The pack of the default scalars (the int objects 1 and 0 themselves, whose
        # scalars_for answer never changes), once a run made it: a repeat's common case
        # without the scalars' key.
        default: list[tuple[tuple[int, ...], bytes, object]] = []

        # Default argument: the closure owns the plan's ints. It holds no view of the
        # operands: its caller runs it only on the live storages it was bound to (their
        # buffers stay alive with them), so a cache of prepared calls never keeps memory
        # alive by itself.
        def run(alpha: Scalar, beta: Scalar, _keep: object = ints) -> bool:
            if default and alpha is _ONE and beta is _ZERO:
                pack = default[0]
            else:
                scalars = scalars_for(alpha, beta)
                if scalars is None:
                    return False
                found = packs.get(scalars[1])
                if found is None:
                    pointers = (t1, t2, pm, pn, pk, scalars[1], first, pl1, second, pl2,
                                scalars[2], dc, plc)
                    if len(packs) > 64:
                        packs.clear()
                    found = packs[scalars[1]] = (pointers, _pack(*pointers), scalars[0])
                pack = found
                if alpha is _ONE and beta is _ZERO:
                    default.append(pack)
            if call_packed is None:
                # ctypes passes c_void_p objects as they are (no argtypes): no conversion.
                raw(*(_VP(v) for v in pack[0]))
            else:
                call_packed(address, pack[1])
            return True

        return run

    return bind


_ONE = 1
_ZERO = 0

_RAW_GEMM: dict[int, Any] = {}

# Prepared runs pass the same pointers every time: packed once, they cost one C call instead
# of a ctypes conversion per argument (see uni/backends/blas/_blascall.c); without the
# compiled helper they go through ctypes as before.
call_packed: Callable[[int, bytes], None] | None
try:
    from uni.backends.blas._blascall import call as call_packed  # optional C part: absent where unbuilt
except ImportError:
    call_packed = None


_PACKERS: dict[int, Callable[..., bytes]] = {}


def _pack(*pointers: int | None) -> bytes:
    """``pointers`` (None: a null pointer) packed as native pointers, for ``call_packed``."""
    packer = _PACKERS.get(len(pointers))
    if packer is None:
        packer = _PACKERS[len(pointers)] = struct.Struct(f"{len(pointers)}P").pack
    if None in pointers:  # rare: most packs are all addresses (no per-pointer pass then)
        pointers = tuple(p or 0 for p in pointers)
    return packer(*pointers)


def _raw_gemm(fn: Any) -> Any:
    """The routine behind ``fn`` (a CFUNCTYPE of 13 c_void_p) as a prototype without
    argtypes, called with c_void_p objects only (one per routine, made once)."""
    address = _address(fn)
    raw = _RAW_GEMM.get(address)
    if raw is None:
        raw = _RAW_GEMM[address] = ctypes.CFUNCTYPE(None)(address)
    return raw


def _batch_offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    """Byte offsets of every batch index (C order) from the first element."""
    offsets = np.zeros(shape, dtype=np.int64)
    for axis, (extent, stride) in enumerate(zip(shape, strides, strict=True)):
        view = [1] * len(shape)
        view[axis] = extent
        offsets += (np.arange(extent, dtype=np.int64) * stride).reshape(view)
    out: list[int] = offsets.ravel().tolist()
    return out


def gemm_batched(
    a: Array, b: Array, c: Array, alpha: Scalar = 1.0, beta: Scalar = 0.0, *,
    conj_a: bool = False, conj_b: bool = False,
) -> Decline | None:
    """gemm over leading batch axes: ``c[i] <- alpha * op(a[i]) @ op(b[i]) + beta * c[i]``.

    ``a`` (*A, m, k) and ``b`` (*B, k, n) broadcast against ``c``'s batch shape (*C, m, n);
    ``c`` never broadcasts. Every slice shares one 2-D layout, so the whole batch is checked
    before anything is written and then runs as one BLAS call per slice. Same declines as
    ``gemm``, plus UNSUPPORTED_LAYOUT for an output whose slices overlap one another.
    """
    kinds = _kinds if _kinds is not None else _load()
    if not kinds:
        return Decline.UNAVAILABLE
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            and isinstance(c, np.ndarray)):
        return Decline.UNSUPPORTED_INSTANCE
    if a.ndim < 2 or b.ndim < 2 or c.ndim < 2:
        return Decline.UNSUPPORTED_SHAPE
    if c.ndim == 2 and a.ndim == 2 and b.ndim == 2:
        return _gemm(kinds, a, b, c, alpha, beta, conj_a, conj_b)
    dt = c.dtype
    kind = kinds.get(dt)
    if kind is None or a.dtype != dt or b.dtype != dt:
        return Decline.UNSUPPORTED_INSTANCE
    batch = c.shape[:-2]
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if b.shape[-2] != k or c.shape[-2:] != (m, n):
        raise ValueError(f"gemm shapes do not match: a {a.shape}, b {b.shape}, c {c.shape}")
    # Broadcasting the inputs is a view with zero batch strides: no copy.
    a = np.broadcast_to(a, (*batch, m, k))
    b = np.broadcast_to(b, (*batch, k, n))
    if not c.flags.writeable:
        return Decline.UNSUPPORTED_INSTANCE
    scalars = _scalar_entry(kind, alpha, beta)
    if scalars is None:
        return Decline.UNSUPPORTED_INSTANCE
    if c.size == 0:
        return None
    if not nests(c.shape, c.strides, kind.itemsize) or not c.flags.aligned:
        return Decline.UNSUPPORTED_LAYOUT
    plan = _plan_gemm(kind, (m, k), a.strides[-2:], (k, n), b.strides[-2:], (m, n),
                      c.strides[-2:], conj_a, conj_b)
    if isinstance(plan, Decline):
        return plan
    _, p_alpha, p_beta, al, be = scalars
    fn, swap, t1, t2, _, pm, pn, pk, pl1, pl2, plc, _, _, _ = plan
    if k == 0 or al == 0:
        _scale(c, be)
        return None
    if not (a.flags.aligned and b.flags.aligned):
        return Decline.UNSUPPORTED_LAYOUT
    if _overlaps(c, a) or _overlaps(c, b):
        return Decline.UNSUPPORTED_INSTANCE
    if be == 0:
        c.fill(0)
    x1, x2 = (b, a) if swap else (a, b)
    base1, base2, base_c = data_address(x1), data_address(x2), data_address(c)
    offs1 = _batch_offsets(batch, x1.strides[:-2])
    offs2 = _batch_offsets(batch, x2.strides[:-2])
    offs_c = _batch_offsets(batch, c.strides[:-2])
    for o1, o2, oc in zip(offs1, offs2, offs_c, strict=True):
        fn(t1, t2, pm, pn, pk, p_alpha, base1 + o1, pl1, base2 + o2, pl2, p_beta, base_c + oc,
           plc)
    return None


# ---------------------------------------------------------------------------------------------
# gemv
# ---------------------------------------------------------------------------------------------


def _plan_gemv(
    kind: _Kind, a_shape: tuple[int, ...], a_strides: tuple[int, ...], x_stride: int,
    y_stride: int, conj_a: bool,
) -> _GemvPlan | Decline:
    """The shared geometry in Fortran-ABI form: flag and int addresses, the byte offsets that
    move a negative-increment vector's pointer to its lowest address, and byte spans."""
    isz = kind.itemsize
    m, n = a_shape
    strides = _element_strides((*a_shape, n, m), (*a_strides, x_stride, y_stride), isz)
    if strides is None or (m > 1 and strides[3] == 0):
        return Decline.UNSUPPORTED_LAYOUT
    if max(m, n) > kind.int_max:
        return Decline.UNSUPPORTED_SHAPE
    geometry = plan_gemv((m, n), (strides[0], strides[1]), strides[2], strides[3],
                         conj_a and kind.is_complex)
    if isinstance(geometry, Decline):
        return geometry
    g = geometry
    if max(g.lda, abs(g.incx), abs(g.incy)) > kind.int_max:
        return Decline.UNSUPPORTED_LAYOUT
    ints = (kind.int_type * 5)(g.m, g.n, g.lda, g.incx, g.incy)
    p = ctypes.addressof(ints)
    _, i1, i2, i3, i4, _ = kind.int_offsets
    span_y = (m - 1) * abs(g.incy) * isz + isz
    if n == 0:
        return kind.gemv, _N, ints, p, p, p, p, p, 0, g.y_offset * isz, 0, 0, span_y
    span_x = (n - 1) * abs(g.incx) * isz + isz
    return (kind.gemv, _FLAGS[g.trans], ints, p, p + i1, p + i2, p + i3, p + i4,
            g.x_offset * isz, g.y_offset * isz, _span(a_shape, a_strides, isz), span_x, span_y)


def gemv(
    a: Array, x: Array, y: Array, alpha: Scalar = 1.0, beta: Scalar = 0.0, *,
    conj_a: bool = False,
) -> Decline | None:
    """``y <- alpha * op(a) @ x + beta * y`` for a 2-D view ``a`` and 1-D views ``x``, ``y``.

    Vector increments may be any non-zero multiple of the itemsize, negative included. Same
    declines as ``gemm``; a conjugated ``a`` needs ``a`` row-major ('C' on its transpose).
    """
    kinds = _kinds if _kinds is not None else _load()
    return _gemv(kinds, a, x, y, alpha, beta, conj_a)


def _gemv(
    kinds: dict[np.dtype[Any], _Kind], a: Array, x: Array, y: Array, alpha: Scalar,
    beta: Scalar, conj_a: bool,
) -> Decline | None:
    kind = _kind_for(kinds, y, a, x)
    if isinstance(kind, Decline):
        return kind
    a_shape = a.shape
    if len(a_shape) != 2 or x.ndim != 1 or y.ndim != 1:
        return Decline.UNSUPPORTED_SHAPE
    m, n = a_shape
    if x.shape[0] != n or y.shape[0] != m:
        raise ValueError(f"gemv shapes do not match: a {a_shape}, x {x.shape}, y {y.shape}")
    if not y.flags.writeable:
        return Decline.UNSUPPORTED_INSTANCE
    scalars = _scalar_entry(kind, alpha, beta)
    if scalars is None:
        return Decline.UNSUPPORTED_INSTANCE
    if m == 0:
        return None
    a_strides = a.strides
    x_stride = x.strides[0]
    y_stride = y.strides[0]
    key = (a_shape, a_strides, x_stride, y_stride, conj_a)
    plan = kind.gemv_plans.get(key)
    if plan is None:
        plan = _plan_gemv(kind, a_shape, a_strides, x_stride, y_stride, conj_a)
        _remember(kind.gemv_plans, key, plan)
    if isinstance(plan, Decline):
        return plan
    _, p_alpha, p_beta, al, be = scalars
    fn, trans, _, pm, pn, plda, pincx, pincy, x_off, y_off, span_a, span_x, span_y = plan
    mask = kind.align_mask
    dy = data_address(y)
    if n == 0 or al == 0:
        return _scale_only(y, dy, mask, be)
    da = data_address(a)
    dx = data_address(x)
    if (da | dx | dy) & mask:
        return Decline.UNSUPPORTED_LAYOUT
    xp = dx + x_off
    yp = dy + y_off
    if (da < yp + span_y and yp < da + span_a and _overlaps(y, a)) or (
        xp < yp + span_y and yp < xp + span_x and _overlaps(y, x)
    ):
        return Decline.UNSUPPORTED_INSTANCE
    if be == 0:
        y.fill(0)
    fn(trans, pm, pn, p_alpha, da, plda, xp, pincx, p_beta, yp, pincy)
    return None


def prepare_gemv(a: Array, x: Array, y: Array) -> Callable[[Scalar, Scalar], bool] | None:
    """A pre-planned gemv on these exact views (``prepare_gemm``'s counterpart).

    ``run(alpha, beta)`` converts the scalars and calls BLAS; it returns False, having
    touched nothing, for alpha == 0 and scalars BLAS cannot express. It keeps a view of
    ``y`` (beta == 0 zero-fills it first, as the general path does: BLAS builds differ on
    whether a zero beta reads y), so its owner must drop it when the operands go
    (``uni._operation_plan`` does).
    """
    bind = gemv_form(a, x, y)
    if bind is None or _overlaps(y, a) or _overlaps(y, x):
        return None
    return bind(data_address(a), data_address(x), data_address(y), y)


def gemv_form(a: Array, x: Array, y: Array
              ) -> Callable[[int, int, int, Array], Callable[[Scalar, Scalar], bool] | None] | None:
    """``prepare_gemv`` for any memory laid out as these views: ``bind(da, dx, dy, y)``
    (addresses of the first elements, and the output's view) makes the run, or None when an
    address is misaligned (see ``gemm_form``)."""
    kinds = _kinds if _kinds is not None else _load()
    if not kinds or not all(isinstance(v, np.ndarray) for v in (a, x, y)):
        return None
    if a.ndim != 2 or x.ndim != 1 or y.ndim != 1:
        return None
    kind = kinds.get(y.dtype)
    if kind is None or a.dtype != y.dtype or x.dtype != y.dtype or not y.flags.writeable:
        return None
    m, n = a.shape
    if x.shape[0] != n or y.shape[0] != m or m == 0 or n == 0:
        return None
    plan = _plan_gemv(kind, a.shape, a.strides, x.strides[0], y.strides[0], False)
    if isinstance(plan, Decline):
        return None
    fn, trans, ints, pm, pn, plda, pincx, pincy, x_off, y_off, _sa, _sx, _sy = plan
    address = _address(fn)
    mask = kind.align_mask

    def bind(da: int, dx: int, dy: int, y: Array) -> Callable[[Scalar, Scalar], bool] | None:
        if (da | dx | dy) & mask:
            return None
        xp, yp = dx + x_off, dy + y_off
        # Packed arguments per scalars buffer (its address), each kept with its buffer: a
        # buffer the kind's cache let go stays alive here, so no address is ever reused
        # under a pack.
        packs: dict[int, tuple[bytes, object]] = {}

        def run(alpha: Scalar, beta: Scalar, _keep: object = ints, y: Array = y) -> bool:
            scalars = _scalar_entry(kind, alpha, beta)
            if scalars is None:
                return False
            if scalars[3] == 0:
                return False  # alpha == 0 never reads a or x: the general path handles it
            if scalars[4] == 0:
                y.fill(0)
            if call_packed is None:
                fn(trans, pm, pn, scalars[1], da, plda, xp, pincx, scalars[2], yp, pincy)
                return True
            pack = packs.get(scalars[1])
            if pack is None:
                if len(packs) > 64:
                    packs.clear()
                pack = packs[scalars[1]] = (_pack(
                    trans, pm, pn, scalars[1], da, plda, xp, pincx, scalars[2], yp, pincy),
                    scalars[0])
            call_packed(address, pack[0])
            return True

        return run

    return bind


def gemv_batched(
    a: Array, x: Array, y: Array, alpha: Scalar = 1.0, beta: Scalar = 0.0, *,
    conj_a: bool = False,
) -> Decline | None:
    """gemv over leading batch axes: ``y[i] <- alpha * op(a[i]) @ x[i] + beta * y[i]``.

    ``a`` (*A, m, n) and ``x`` (*X, n) broadcast against ``y``'s batch shape (*Y, m); ``y``
    never broadcasts. Same declines as ``gemm_batched``.
    """
    kinds = _kinds if _kinds is not None else _load()
    if not kinds:
        return Decline.UNAVAILABLE
    if not (isinstance(a, np.ndarray) and isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)):
        return Decline.UNSUPPORTED_INSTANCE
    if a.ndim < 2 or x.ndim < 1 or y.ndim < 1:
        return Decline.UNSUPPORTED_SHAPE
    if y.ndim == 1 and a.ndim == 2 and x.ndim == 1:
        return _gemv(kinds, a, x, y, alpha, beta, conj_a)
    dt = y.dtype
    kind = kinds.get(dt)
    if kind is None or a.dtype != dt or x.dtype != dt:
        return Decline.UNSUPPORTED_INSTANCE
    batch = y.shape[:-1]
    m, n = a.shape[-2:]
    if x.shape[-1] != n or y.shape[-1] != m:
        raise ValueError(f"gemv shapes do not match: a {a.shape}, x {x.shape}, y {y.shape}")
    a = np.broadcast_to(a, (*batch, m, n))
    x = np.broadcast_to(x, (*batch, n))
    if not y.flags.writeable:
        return Decline.UNSUPPORTED_INSTANCE
    scalars = _scalar_entry(kind, alpha, beta)
    if scalars is None:
        return Decline.UNSUPPORTED_INSTANCE
    if y.size == 0:
        return None
    if not nests(y.shape, y.strides, kind.itemsize) or not y.flags.aligned:
        return Decline.UNSUPPORTED_LAYOUT
    plan = _plan_gemv(kind, (m, n), a.strides[-2:], x.strides[-1], y.strides[-1], conj_a)
    if isinstance(plan, Decline):
        return plan
    _, p_alpha, p_beta, al, be = scalars
    fn, trans, _, pm, pn, plda, pincx, pincy, x_off, y_off, _, _, _ = plan
    if n == 0 or al == 0:
        _scale(y, be)
        return None
    if not (a.flags.aligned and x.flags.aligned):
        return Decline.UNSUPPORTED_LAYOUT
    if _overlaps(y, a) or _overlaps(y, x):
        return Decline.UNSUPPORTED_INSTANCE
    if be == 0:
        y.fill(0)
    base_a = data_address(a)
    base_x = data_address(x) + x_off
    base_y = data_address(y) + y_off
    offs_a = _batch_offsets(batch, a.strides[:-2])
    offs_x = _batch_offsets(batch, x.strides[:-1])
    offs_y = _batch_offsets(batch, y.strides[:-1])
    for oa, ox, oy in zip(offs_a, offs_x, offs_y, strict=True):
        fn(trans, pm, pn, p_alpha, base_a + oa, plda, base_x + ox, pincx, p_beta, base_y + oy,
           pincy)
    return None
