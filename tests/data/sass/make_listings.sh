#!/usr/bin/env bash
# Regenerate the committed SASS listings from the .cu files beside this script:
# nvcc for sm_90 (as a GPU build compiles: -O3 -rdc=true), then cuobjdump -sass
# (and nvdisasm, for one).
# tests/test_sass.py reads the listings; with nvcc and the disassembler installed it also
# compiles the sources again and checks that the readings agree.
set -euo pipefail
cd "$(dirname "$0")"
tools=$(python -c "from convbench import sass; print(sass.require_tools())")
for cu in *.cu; do
  nvcc -std=c++17 -O3 -arch=sm_90 -rdc=true -c -o "/tmp/${cu%.cu}.o" "$cu"
  PATH="$tools:$PATH" cuobjdump -sass "/tmp/${cu%.cu}.o" > "${cu%.cu}.sass"
done
# The same kernel as nvdisasm prints it (labels instead of addresses as branch targets).
(cd /tmp && PATH="$tools:$PATH" cuobjdump -xelf all twoloops.o > /dev/null)
"$tools/nvdisasm" /tmp/twoloops.1.sm_90.cubin > twoloops.nvdisasm
