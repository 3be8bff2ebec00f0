"""The ``overlong`` policy's names: what to do with a conversation longer than ``seq_len``.

Chat data is packed whole (``packing``), so a conversation longer than a row fits nowhere: ``error``
refuses the data (naming the record), ``drop`` leaves it out, ``truncate`` keeps its first ``seq_len``
tokens. One definition for the config (the dataset's ``overlong`` field: this module imports nothing
heavy, as resolving must not), ``prepare --overlong`` and the loader.
"""

from typing import Literal, TypeAlias

__all__ = ["OVERLONG", "Overlong"]

Overlong: TypeAlias = Literal["error", "drop", "truncate"]
OVERLONG: tuple[Overlong, ...] = ("error", "drop", "truncate")
