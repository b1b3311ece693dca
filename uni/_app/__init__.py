"""The applications of uni's public API: ``uni demo`` (its streaming pipeline, host and CUDA
stages, and Gantt chart), ``uni bench``, ``uni info`` and the machine facts they report.

They sit above the library and use it as any program would: these modules import only
uni's public modules (``uni``, ``uni.cuda``, ``uni.storage``, ``uni.backends``, ...) and
each other; tests/test_layers.py checks it. ``uni/cli.py`` is the entry point.
"""
