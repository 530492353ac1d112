"""Kernel registry and reference kernels (see :mod:`tilecast.kernels.registry`)."""

from tilecast.kernels.registry import KERNELS, MODE_NAMES, R, RW, W, Kernel, all_kernels, get

__all__ = ["KERNELS", "MODE_NAMES", "R", "RW", "W", "Kernel", "all_kernels", "get"]
