"""Triton kernels, one op per file: kernels, launchers, autograd.Function, functional entry point.

Importing a submodule imports Triton, which reads ``TRITON_INTERPRET`` at that moment.
"""
