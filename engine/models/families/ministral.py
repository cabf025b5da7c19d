"""Ministral: the Llama layer, windowed and full layers by layer type."""

from . import Family

FAMILY = Family("ministral", ("ministral",))
