"""The guide's language-model recipe (docs/guide/packing.md), run as a test: a real text corpus (the
Python standard library's own sources, on every machine) tokenized byte by byte, converted, packed,
a tiny NumPy model trained a few hundred steps, checkpointed and resumed with identical batches, and
one finite evaluation pass. Dependency-free: NumPy and loaderx only."""

from __future__ import annotations

import pathlib
import sysconfig

import numpy as np

import loaderx

VOCAB = 257  # bytes 0..255 as tokens 1..256; token 0 ends a document
EOS = 0
SEQ, BATCH, STEPS, CHECKPOINT = 65, 16, 300, 150


def source_files(count: int = 300) -> list[pathlib.Path]:
    """A few hundred of the standard library's modules, spread over the whole tree."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in sorted(root.glob("**/*.py"))
             if not {"test", "tests", "site-packages"} & set(f.relative_to(root).parts)]
    return files[:: max(1, len(files) // count)][:count]


def tokenize(path: pathlib.Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.uint16) + 1


def write_corpus(root: pathlib.Path) -> tuple[loaderx.RaggedDataset, loaderx.RaggedDataset]:
    """Train and validation documents in two datasets: the split is by file, before packing,
    so no document has tokens on both sides."""
    files = source_files()
    val = files[::20]
    train = [f for f in files if f not in set(val)]
    for name, part in (("train", train), ("val", val)):
        # raw: tokens barely shrink and zstd costs ~10x per batch; 1 MiB pieces let a
        # document past the record limit through (one stdlib module is 1.5 MB as uint16).
        loaderx.from_iterator(root / name, (tokenize(f) for f in part), codec="raw",
                              max_record_bytes=1 << 20, progress=False)
    return loaderx.RaggedDataset(root / "train"), loaderx.RaggedDataset(root / "val")


class Bigram:
    """Next-token logits from the current token alone: one (VOCAB, VOCAB) table, trained with
    Adam on the cross-entropy of the tokens that stay inside their document."""

    def __init__(self) -> None:
        self.w = np.zeros((VOCAB, VOCAB), dtype=np.float64)
        self.m = np.zeros_like(self.w)
        self.v = np.zeros_like(self.w)
        self.t = 0

    def loss_and_grad(self, batch: dict[str, np.ndarray]) -> tuple[float, np.ndarray, int]:
        tokens, seg = batch["tokens"].astype(np.int64), batch["tokens_segment_ids"]
        x, y = tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1)
        # Predict the next token only inside one document (and never from padding).
        keep = ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)).reshape(-1)
        x, y = x[keep], y[keep]
        logits = self.w[x]
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).sum())
        p[np.arange(len(y)), y] -= 1
        grad = np.zeros_like(self.w)
        np.add.at(grad, x, p)
        return loss, grad, len(y)

    def step(self, batch: dict[str, np.ndarray], lr: float = 0.05) -> float:
        loss, grad, n = self.loss_and_grad(batch)
        grad /= max(n, 1)
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * grad
        self.v = 0.999 * self.v + 0.001 * grad * grad
        m_hat = self.m / (1 - 0.9 ** self.t)
        v_hat = self.v / (1 - 0.999 ** self.t)
        self.w -= lr * m_hat / (np.sqrt(v_hat) + 1e-8)
        return loss / max(n, 1)

    def state(self) -> dict[str, np.ndarray]:
        return {"w": self.w, "m": self.m, "v": self.v, "t": np.array(self.t)}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.w, self.m, self.v = state["w"].copy(), state["m"].copy(), state["v"].copy()
        self.t = int(state["t"])


def make_loader(train: loaderx.PackedDataset) -> loaderx.DataLoader:
    return loaderx.DataLoader({"tokens": train}, batch_size=BATCH, num_workers=2, seed=0)


def evaluate(model: Bigram, val: loaderx.PackedDataset) -> float:
    """Mean cross-entropy over every validation row once (a finite pass)."""
    total, count = 0.0, 0
    with loaderx.DataLoader({"tokens": val}, batch_size=BATCH, num_workers=2) as loader:
        for batch in loader.epoch():
            loss, _, n = model.loss_and_grad(batch)
            total, count = total + loss, count + n
    return total / count


def test_language_model_recipe(tmp_path):
    train_docs, val_docs = write_corpus(tmp_path)
    train = loaderx.pack(train_docs, SEQ, eos_id=EOS, seed=0)  # documents concatenated
    val = loaderx.pack(val_docs, SEQ, eos_id=EOS, seed=0)
    assert train.documents == len(source_files()) - len(source_files()[::20])
    assert len(train) > STEPS * BATCH // 4 and len(val) > 0

    model = Bigram()
    start = evaluate(model, val)
    assert abs(start - np.log(VOCAB)) < 1e-9  # untrained: uniform over the vocabulary

    losses, seen = [], {}
    with make_loader(train) as loader:
        for step in range(STEPS):
            if step == CHECKPOINT:
                checkpoint = {"loader": loader.state_dict(),
                              "model": {k: v.copy() for k, v in model.state().items()}}
            batch = next(loader)
            if CHECKPOINT <= step < CHECKPOINT + 10:
                seen[step] = {k: v.copy() for k, v in batch.items()}
            losses.append(model.step(batch))
    first, last = np.mean(losses[:20]), np.mean(losses[-20:])
    print(f"train loss {first:.2f} -> {last:.2f}")
    assert last < first - 1.0, (first, last)  # measurably learning
    trained = evaluate(model, val)
    print(f"validation loss {start:.2f} -> {trained:.2f} over {len(val)} rows")
    assert np.isfinite(trained) and trained < start - 1.0, (start, trained)

    # Resume from the checkpoint: the same batches, byte for byte, and the same model.
    resumed = Bigram()
    resumed.load(checkpoint["model"])
    with make_loader(train) as loader:
        loader.load_state_dict(checkpoint["loader"])
        for step in range(CHECKPOINT, STEPS):
            batch = next(loader)
            if step in seen:
                for key, value in seen[step].items():
                    assert batch[key].tobytes() == value.tobytes(), (step, key)
            resumed.step(batch)
    assert np.array_equal(resumed.w, model.w)
