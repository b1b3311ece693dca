"""uni's compiled parts, all optional: the uncontended host lease (uni/_fastlease.c), vector
slices (uni/_fastview.c) and the prepared BLAS call (uni/backends/blas/_blascall.c).

Where they cannot be built (no C compiler, no Python headers) the install goes on and uni
runs the Python code each was written from (``uni info`` says which runs).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("uni._fastlease", ["uni/_fastlease.c"], depends=["uni/_slots.h"], optional=True),
    Extension("uni._fastview", ["uni/_fastview.c"], depends=["uni/_slots.h"], optional=True),
    Extension("uni.backends.blas._blascall", ["uni/backends/blas/_blascall.c"], optional=True),
])
