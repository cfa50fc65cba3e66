"""Timing and benchmarks on a GPU: L2-flushed event timing, and the decode benchmark against PyTorch."""
