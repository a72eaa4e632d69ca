#!/usr/bin/env python3
"""Tokenizes a text file byte-level into train.bin and val.bin for oobleck's [data] train / validation.

  python3 prepare.py INPUT.txt [--out-dir DIR] [--val-fraction 0.1]

Each byte of the file is one token id (0..255), written as a flat little-endian uint16 array, the
format nanoGPT's prepare scripts write (`dtype = "uint16"` in the job file). The first
(1 - val_fraction) of the bytes become train.bin, the rest val.bin, so the held-out text is text
the model never trains on. Byte ids fit any vocabulary of 256 or more: GPT-2's 50257 works (ids
256.. are then never seen), and `vocab = 256` gives a byte-level GPT-2 with a much smaller
embedding. Standard library only.
"""
import argparse
import array
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="a text file (any bytes: it is read byte-level)")
    parser.add_argument("--out-dir", default=".", help="where train.bin and val.bin go (default: here)")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="the held-out tail (default 0.1)")
    a = parser.parse_args()
    if not 0 < a.val_fraction < 1:
        sys.exit("error: --val-fraction must be in (0, 1)")
    with open(a.input, "rb") as f:
        data = f.read()
    split = int(len(data) * (1 - a.val_fraction))
    if split < 2 or len(data) - split < 2:
        sys.exit(f"error: {a.input} has {len(data)} bytes: too few to split into train and validation")
    os.makedirs(a.out_dir, exist_ok=True)
    for name, part in (("train.bin", data[:split]), ("val.bin", data[split:])):
        ids = array.array("H", iter(part))  # one uint16 per byte
        if sys.byteorder != "little":
            ids.byteswap()
        with open(os.path.join(a.out_dir, name), "wb") as f:
            ids.tofile(f)
        print(f"{os.path.join(a.out_dir, name)}: {len(part)} tokens")


if __name__ == "__main__":
    main()
