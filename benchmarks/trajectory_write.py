"""What a bag run's checkpoints cost in trajectory writes: compressed against plain ``.npz``.

    python3 benchmarks/trajectory_write.py --trajectory runs/bag/trajectory.npz [--every 120]

``ipcjax bag`` rewrites trajectory.npz with every frame so far at each checkpoint (every
``--every`` steps) and once at the end. For each of those frame counts, this writes the
first frames of a whole run's trajectory with ``np.savez_compressed`` and with
``np.savez`` (what ``ipcjax.runfolder.write_trajectory`` does), alternately, into a
temporary folder, and prints JSON: the sum over the run of each, their ratio, and the
file sizes of the whole trajectory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectory", required=True, help="a whole run's trajectory.npz")
    ap.add_argument("--every", type=int, default=120, help="steps between checkpoints (ipcjax bag: 120)")
    args = ap.parse_args(argv)
    with np.load(args.trajectory) as f:
        arrays = {k: f[k] for k in f.files}
    n = len(arrays["time"])
    counts = list(range(args.every + 1, n, args.every)) + [n]  # frames at each checkpoint, then the end
    sums = {"compressed": 0.0, "plain": 0.0}
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in counts:
            part = {key: (a[:k] if key in ("film", "spheres", "time") else a) for key, a in arrays.items()}
            for name, write in (("compressed", np.savez_compressed), ("plain", np.savez)):
                path = os.path.join(tmp, f"{name}.npz")
                t = time.perf_counter()
                write(path, **part)
                sums[name] += time.perf_counter() - t
                if k == n:
                    sizes[name] = os.path.getsize(path)
    out = dict(command="python3 benchmarks/trajectory_write.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               frames=n, writes=len(counts), seconds_over_the_run=sums,
               plain_over_compressed=sums["plain"] / sums["compressed"], bytes_of_the_whole_trajectory=sizes)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
