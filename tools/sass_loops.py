#!/usr/bin/env python3
"""sass_loops.py - the machine code of the CUDA kernels' loops, counted.

Without a GPU, the one cost of a compute-bound kernel that can still be
read off is how many instructions it issues for its work.  This compiles a
.cu file under kernels/cuda with nvcc for one architecture, disassembles it
with nvdisasm and, for every kernel (or those whose mangled name contains
one of the FILTER strings), prints each loop -- the instructions from a
label to a branch back to it -- with its length, its integer MACs and the
instructions it issues per 4096 MACs (one mma.sync m16n8k32):

    IMMA.MNK    M*N*K MACs per warp instruction (IMMA.16832: 4096)
    IDP.4A      4 per lane, 128 per warp instruction

    tools/sass_loops.py kernels/cuda/matmul_mma.cu [FILTER...]
        [--arch sm_90] [--nvdisasm PATH] [--top N] [--all]

nvdisasm is not in every CUDA toolkit install (this project's machines
have nvcc and ptxas only); PyPI has it:
    pip download --no-deps nvidia-cuda-nvdisasm
    python3 -m zipfile -e nvidia_cuda_nvdisasm-*.whl /tmp/nvd
    tools/sass_loops.py ... --nvdisasm /tmp/nvd/nvidia/cu13/bin/nvdisasm
These are static counts: a loop's length includes the loops nested in it
once each, and nothing here says anything of latency, memory or occupancy.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile


def macs(op):
    """Integer MACs one warp instruction OP does (0 for any other)."""
    m = re.match(r"IMMA\.(\d+)", op)
    if m:  # the shape as MNK digits: 16832 = m16 n8 k32, 8816 = m8 n8 k16
        d = m.group(1)
        for mlen in (2, 1):
            for nlen in (1, 2):
                mm, nn, kk = d[:mlen], d[mlen:mlen + nlen], d[mlen + nlen:]
                if kk and int(mm) in (8, 16) and int(nn) in (8, 16) and int(kk) in (8, 16, 32, 64):
                    return int(mm) * int(nn) * int(kk)
        return 0
    if op.startswith("IDP.4A"):
        return 128
    if op.startswith("IDP.2A"):
        return 64
    return 0


def kernels(sass):
    """(mangled name, [instruction text], {label: index}) per kernel."""
    parts = re.split(r"\n\s*\.text\.(\S+):", sass)
    for i in range(1, len(parts), 2):
        labels, ins = {}, []
        for line in parts[i + 1].split("\n"):
            m = re.match(r"^\s*(\.L_x_\d+):", line)
            if m:
                labels[m.group(1)] = len(ins)
                continue
            m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
            if m:
                ins.append(m.group(1))
        yield parts[i], ins, labels


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cu")
    ap.add_argument("filters", nargs="*")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvdisasm", default=os.environ.get("NVDISASM") or shutil.which("nvdisasm"))
    ap.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc"))
    ap.add_argument("--top", type=int, default=5, help="opcodes listed per loop (default 5)")
    ap.add_argument("--all", action="store_true", help="also the loops that do no integer MACs")
    a = ap.parse_intermixed_args()
    if not a.nvcc or not a.nvdisasm:
        sys.exit("sass_loops: needs nvcc and nvdisasm (--nvdisasm PATH; see --help)")
    src = os.path.dirname(os.path.abspath(a.cu))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([a.nvcc, "-arch=" + a.arch, "-O3", "-std=c++17", "-I" + src,
                        "-I" + os.path.dirname(src), "-cubin", "-o", cubin, a.cu], check=True)
        sass = subprocess.run([a.nvdisasm, "-c", cubin], check=True, capture_output=True,
                              text=True).stdout
    for name, ins, labels in kernels(sass):
        if a.filters and not any(f in name for f in a.filters):
            continue
        print("%s: %d instructions" % (name, len(ins)))
        for k, text in enumerate(ins):
            m = re.search(r"BRA\s+(?:\S+\s+)?`?\(?(\.L_x_\d+)", text)
            if not m or m.group(1) not in labels or labels[m.group(1)] > k:
                continue
            body = [opcode(t) for t in ins[labels[m.group(1)]:k + 1]]
            work = sum(macs(op) for op in body)
            if not work and not a.all:
                continue
            ops = collections.Counter(body)
            top = ", ".join("%s %d" % kv for kv in ops.most_common(a.top))
            per = "%5.1f per 4096 MACs" % (len(body) * 4096.0 / work) if work else "no MACs"
            print("  loop of %4d (%d-%d): %6d MACs, %s  (%s)"
                  % (len(body), labels[m.group(1)], k, work, per, top))


if __name__ == "__main__":
    main()
