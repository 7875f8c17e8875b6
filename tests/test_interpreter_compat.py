"""The loader on every interpreter ``requires-python`` admits, not only the project's own.

Debian 12's ``python3`` is CPython 3.11.2, whose ``threading.RLock`` has no ``_recursion_count``
(later 3.11 releases added it). The loader once called it on every notify, so the first
``next()`` failed there. These tests run the loader under a lock that has only the public API
and the Condition protocol (``_is_owned``, ``_release_save``, ``_acquire_restore``, which
``threading.Condition`` itself needs), in a fresh interpreter each. CI also runs a broad part of
the suite under Debian's own ``python3`` (scripts/test_system_python.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from loaderx import from_numpy

#: Gives every loader window an RLock like 3.11.2's: the pure-Python one (the same protocol as
#: the C one) without the attribute that release lacks. Only the loader's: the standard library
#: of the interpreter running the test may use its own lock's attributes (3.11.7's
#: multiprocessing does).
OLD_RLOCK = """
import threading
from loaderx._loader import window as _window
class OldRLock(threading._PyRLock):
    def __getattribute__(self, name):
        if name == "_recursion_count":
            raise AttributeError(f"'_thread.RLock' object has no attribute {name!r}")
        return super().__getattribute__(name)
plain_init = _window.Window.__init__
def old_init(self, *args, **kwargs):
    plain_init(self, *args, **kwargs)
    self.lock = OldRLock()
    self.cond = threading.Condition(self.lock)
_window.Window.__init__ = old_init
"""

LOADER = OLD_RLOCK + """
import json, sys
import numpy as np
from loaderx import DataLoader, DenseDataset
root, mode = sys.argv[1:3]
streams = {"x": DenseDataset(root + "/x")}
with DataLoader(streams, batch_size=8, num_workers=0, seed=5) as reference:
    want = [next(reference)["x"].tolist() for _ in range(30)]
with DataLoader(streams, batch_size=8, num_workers=2, seed=5, worker_mode=mode) as loader:
    lock_type = type(loader._pipe.lock).__name__
    got = [next(loader)["x"].tolist() for _ in range(20)]
    loader.seek(10)
    got_after_seek = [next(loader)["x"].tolist() for _ in range(20)]
    state = loader.state_dict()
print(json.dumps({"lock": lock_type, "first": got == want[:20],
                  "after_seek": got_after_seek == want[10:30], "step": state["step"]}))
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_loader_runs_without_private_lock_attributes(tmp_path, mode):
    """Thread and process workers, seek and state_dict, under 3.11.2's RLock: the same
    batches as the in-process reference, no AttributeError."""
    from_numpy(str(tmp_path / "x"), np.arange(400 * 3, dtype=np.int32).reshape(400, 3))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(LOADER), str(tmp_path), mode],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"lock": "OldRLock", "first": True, "after_seek": True, "step": 30}
