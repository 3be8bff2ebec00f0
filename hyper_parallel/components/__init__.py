"""Training components: each kind is a class with a nested frozen attrs ``Config`` (configuration only).

These modules import attrs and nothing heavier; runtime construction (``build()``) imports torch lazily.
"""
