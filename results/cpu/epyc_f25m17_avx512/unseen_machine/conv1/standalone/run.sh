#!/bin/bash
# The standalone copy of the few-channel kernel's first drafts (conv1, 64^3 batch 2, 2 threads,
# 25 calls, median): the variants docs/kernel-design.md quotes.  Run from this folder.
set -e
run() { g++ -O3 -fopenmp "$@" few.cpp -o /tmp/few_standalone && echo "flags: $*" && OMP_NUM_THREADS=2 /tmp/few_standalone; }
run -march=native -DPB=8 -DNT=0
run -march=native -DPB=8 -DNT=1
run -march=native -DPB=14 -DNT=1 -DASM=1
run -march=native -mno-avx512f -mtune=generic -ffast-math -DVL=8 -DPB=5 -DNV=2 -DNT=1
run -march=native -mno-avx512f -mtune=generic -ffast-math -DVL=8 -DPB=6 -DNV=2 -DNT=1 -DASM5=1
