"""What every scene builder returns: a frozen dataclass of named fields.

Scenes are read by attribute (``scene.model``, ``scene.x``). :class:`ByName` also lets
``scene["model"]`` read the same field: a compatibility accessor for code written when
the builders returned dicts (the README's snippets, ``benchmarks/``); new code uses
attributes.
"""
from __future__ import annotations


class ByName:
    """``scene[name]`` and ``scene.get(name, default)`` read the field ``name``."""

    def __getitem__(self, name: str):
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default=None):
        return getattr(self, name, default)
