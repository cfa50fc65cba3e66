"""splitlab: a research workbench for the split-K planning of GPU attention-decode kernels."""

__version__ = "0.1.0"
