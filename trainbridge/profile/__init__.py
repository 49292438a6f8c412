"""Profiling: the baseline step-time distribution, operator breakdown and bottleneck verdict."""

from .analysis import ProfileReport, analyse
from .render import render_profile

__all__ = ["ProfileReport", "analyse", "render_profile"]
