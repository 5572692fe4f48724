"""Triton -> Pallas porting front end: parse `@triton.jit` kernels and their launcher with libcst (never importing
triton or torch), translate the common subset by rules, and emit a pallasopt kernel module (docs/kernel-format.md)."""

from .module import PortResult, port_source

__all__ = ["PortResult", "port_source"]
