#!/usr/bin/env python3
"""Writes a copy of MLX's CUDA library that carries device code for one GPU
architecture only, so that MLX, the binaries and the serving bench's files
travel to a device machine in one call (scripts/gpu-prepare.sh, ONE=1).

libmlx.so of the mlx-cuda-13 wheel is 145 MB: 64 MB of it is `.nv_fatbin`,
one cubin per architecture (sm_75, 80, 90, 100, 120, 121) and PTX for
compute_120 for each of its ~100 CUDA sources; 25 MB is its symbol table.
The driver loads the one image that matches the device (a cubin runs only on
its own major architecture, and PTX only on newer ones), so on an H100 or
H200 (sm_90) only the sm_90 cubins are read. This zeroes the payload of every
other image in place (offsets and headers unchanged, so the fatbinary still
parses; the zeros compress to nothing) and strips the symbol table
(`strip --strip-unneeded`; the dynamic symbols stay).

Usage: gpu-slim-mlx.py IN_LIBMLX OUT_LIBMLX [ARCH ...]   (default ARCH: 90)
"""

import os
import shutil
import struct
import subprocess
import sys

MAGIC = 0xBA55ED50
ELF, PTX = 2, 1


def fatbin_range(path):
    """(offset, size) of the file's .nv_fatbin section."""
    out = subprocess.run(["readelf", "-S", "-W", path], check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        fields = line.replace("[", " ").replace("]", " ").split()
        if ".nv_fatbin" in fields:
            i = fields.index(".nv_fatbin")
            # Name Type Address Off Size ...
            return int(fields[i + 3], 16), int(fields[i + 4], 16)
    raise SystemExit(f"gpu-slim-mlx: {path} has no .nv_fatbin section")


def slim(data, keep):
    """Zeroes, in the bytearray `data` (a .nv_fatbin section), the payload of
    every image that is not a cubin for an architecture in `keep`. Returns
    (kept, zeroed) byte counts."""
    kept = zeroed = 0
    pos = 0
    while pos + 16 <= len(data):
        magic, _version, header, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != MAGIC:
            pos += 8  # fatbinaries are 8-byte aligned, with padding between
            continue
        entry, end = pos + header, pos + header + size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            start = entry + entry_header
            if kind == ELF and arch in keep:
                kept += payload
            else:
                data[start : start + payload] = bytes(payload)
                zeroed += payload
            entry = start + payload
        pos = end
    return kept, zeroed


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    keep = {int(a) for a in sys.argv[3:]} or {90}
    offset, size = fatbin_range(src)
    tmp = dst + ".tmp"
    shutil.copyfile(src, tmp)
    with open(tmp, "r+b") as f:
        f.seek(offset)
        data = bytearray(f.read(size))
        kept, zeroed = slim(data, keep)
        if kept == 0:
            raise SystemExit(f"gpu-slim-mlx: no cubin for sm_{sorted(keep)} in {src}")
        f.seek(offset)
        f.write(data)
    subprocess.run(["strip", "--strip-unneeded", tmp], check=True)
    os.replace(tmp, dst)
    print(
        f"gpu-slim-mlx: kept {kept >> 20} MiB of sm_{','.join(map(str, sorted(keep)))} cubins, "
        f"zeroed {zeroed >> 20} MiB; {os.path.getsize(src) >> 20} -> {os.path.getsize(dst) >> 20} MiB",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
