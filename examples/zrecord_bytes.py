"""The raw byte-record store, Zrecord, on its own.

Run with ``python examples/zrecord_bytes.py``
in an environment where loaderx is installed. It writes a store in the current directory.
"""

import numpy as np

from loaderx.zrecord import Zrecord

# Three images of different sizes, packed into one buffer: record i starts at offsets[i].
images = [np.full((h, 4), h, dtype=np.uint8) for h in (2, 3, 5)]
src = np.concatenate([im.ravel() for im in images])
offsets = np.cumsum([0] + [im.size for im in images[:-1]])

with Zrecord("quickstart-store", codec="zstd") as store:
    first = store.append(src, offsets)
    store.append(b"a label", [0], codec="raw")
    print(f"appended records {first}..{len(store) - 1}; stats: {store.stats()}")

    # Gather records 2 and 0 straight into one destination, each at its own byte offset.
    lengths = store.lengths([2, 0])
    dst = np.zeros(int(lengths.sum()), dtype=np.uint8)
    store.gather([2, 0], dst, [0, int(lengths[0])])
    print("record 2:", dst[: lengths[0]].reshape(5, 4).tolist())
    print("record 0:", dst[lengths[0]:].reshape(2, 4).tolist())

    label = np.zeros(7, dtype=np.uint8)
    store.gather([3], label, [0])
    print("record 3:", label.tobytes().decode())
