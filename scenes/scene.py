"""What every scene builder returns: a frozen dataclass of named fields.

Scenes are read by attribute (``scene.model``, ``scene.x``). :class:`ByName` also lets
``scene["model"]`` read the same field: a compatibility accessor for code that must also
run against commits whose builders returned dicts (``benchmarks/ab_step.py`` runs one worker
on both trees) and for the other ``benchmarks/`` scripts written then. The library, the jobs and the
tests read attributes (tests/test_pouch.py checks the accessor itself).
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
