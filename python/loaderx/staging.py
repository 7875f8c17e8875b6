"""Atomic publishing of a store or a dataset (see :mod:`loaderx._store.staging`, whose module this
name is).

The module lives in :mod:`loaderx._store`; this path stays for those who import it. Importing it
gives that very module object, not a copy of its names: the converter reaches into it through
this path, and the crash tests set its hooks (``_hook``, ``is_mount_point``) through either
name, so two module objects would split a hook in two.
"""

import sys
from typing import TYPE_CHECKING

from loaderx._store import staging as _staging

if TYPE_CHECKING:  # what a type checker sees here: the module's names
    from loaderx._store.staging import *  # noqa: F403

sys.modules[__name__] = _staging
