"""The one compiled part of uni: the uncontended host lease in C (uni/_fastlease.c).

Optional: where it cannot be built (no C compiler, no Python headers) the install goes on and
uni uses the Python twin of the same code (``uni info`` says which one runs).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("uni._fastlease", ["uni/_fastlease.c"], optional=True)])
