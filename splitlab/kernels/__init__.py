"""Triton split-K decode kernels, their fp64 references (``reference``) and the shared ``combine``."""
