"""Triton kernels, one op per file: kernels, launchers, autograd.Function, functional entry point.

Importing an op's submodule imports Triton, which reads ``TRITON_INTERPRET`` at that moment;
``_library`` (the custom operators, imported by ``import crossfuse``) does not.
"""
