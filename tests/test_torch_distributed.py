"""A two-process ``torch.distributed`` job (gloo on the CPU, rendezvous on 127.0.0.1):
``torch_process_shard`` reads each process's shard, and the slices the hosts load for a step,
gathered, are that step's global batch. In CI (CI=true) a missing torch fails the test."""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys

import numpy as np

from frameworks_required import need_installed
from loaderx.converter import from_numpy

CHILDREN = pathlib.Path(__file__).with_name("framework_children.py")
N = 101
DEADLINE = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_process_job_on_the_cpu(tmp_path):
    need_installed("torch")
    from_numpy(tmp_path / "x", np.arange(N * 8, dtype=np.float32).reshape(N, 8) * 0.25)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(CHILDREN), "torch_distributed", str(port),
                               str(rank), str(tmp_path / "x"), str(N)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    hosts = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=DEADLINE)
            assert p.returncode == 0, out + err
            hosts.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:  # one that failed leaves the other waiting for its peer
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [h["shard"] for h in hosts] == [[0, 2], [1, 2]]
    assert all(h["same"] == [True] * 3 and h["step"] == 3 for h in hosts)
