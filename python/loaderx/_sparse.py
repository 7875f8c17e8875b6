"""The old path of :mod:`loaderx._store.sparse` (copies that keep a store's holes), kept while
modules still import it from here: importing it gives that very module object, so a lookup or a
patch through either name reaches the same place."""

import sys
from typing import TYPE_CHECKING

from loaderx._store import sparse as _sparse

if TYPE_CHECKING:  # what a type checker sees here: the module's names
    from loaderx._store.sparse import *  # noqa: F403

sys.modules[__name__] = _sparse
