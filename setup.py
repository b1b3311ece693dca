"""uni's one compiled part, optional: the prepared BLAS call (uni/backends/blas/_blascall.c), a C
function that replaces a whole Python function over public types (docs/performance.md).

Where it cannot be built (no C compiler, no Python headers) the install goes on and uni calls
BLAS through ctypes (``uni info`` says which runs).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("uni.backends.blas._blascall", ["uni/backends/blas/_blascall.c"], optional=True),
])
