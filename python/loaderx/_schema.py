"""The old path of :mod:`loaderx._store.schema` (``schema.msgpack``), kept while modules still
import it from here: importing it gives that very module object, so a lookup or a patch through
either name reaches the same place."""

import sys
from typing import TYPE_CHECKING

from loaderx._store import schema as _schema

if TYPE_CHECKING:  # what a type checker sees here: the module's names
    from loaderx._store.schema import *  # noqa: F403

sys.modules[__name__] = _schema
