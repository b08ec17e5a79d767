# Outside oracle: reads a megatrain checkpoint directory with h5py and numpy only (no megatrain code)
# and prints a JSON summary the C++ test compares with what it wrote.
import json, os, sys
import h5py
import numpy as np

ckpt = sys.argv[1]
manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
out = {"step": manifest["step"], "stages": {}}
for entry in manifest["stages"]:
    with h5py.File(os.path.join(ckpt, entry["shard"]), "r") as f:
        assert f.attrs["format"] == "megatrain-checkpoint", f.attrs["format"]
        g = f[entry["group"]]
        stage = {"kind": g.attrs["kind"], "prefix": g.attrs["prefix"], "stage": int(g.attrs["stage"]), "tensors": {}}
        for state in manifest["states"]:
            for name, ds in g[state].items():
                assert ds.dtype == np.float32, ds.dtype
                a = ds[()]
                # Every element in C order (float32 -> float64 is exact, and JSON's shortest repr of a
                # double round-trips), so a transposed or shifted tensor cannot pass.
                stage["tensors"][state + "/" + name] = {
                    "shape": list(a.shape), "values": np.ascontiguousarray(a).astype(np.float64).ravel().tolist(),
                    "checksum_attr": int(ds.attrs["xxh3_64"]) != 0}
        out["stages"][str(entry["stage"])] = stage
print(json.dumps(out))
