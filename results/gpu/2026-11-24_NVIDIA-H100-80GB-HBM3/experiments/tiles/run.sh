#!/bin/bash
# Tile-size experiment for implicitGemmNCDHW on CosmoFlow v1 at batch 16 (H100).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
C="--impl implicitGemmNCDHW --paramscsv cosmoflow --batch 16"
declare -A P
P[t64x64_r4x4]=""
P[t128x128_r8x8]="--param CTAtileM=128 --param CTAtileN=128 --param threadTileM=8 --param threadTileN=8"
P[t128x64_r8x4]="--param CTAtileM=128 --param threadTileM=8"
t0=$(date +%s)
for v in "${!P[@]}"; do python3 scripts/precompile.py $C --target gpu ${P[$v]} --jobs 6 > $OUT/precompile_$v.log 2>&1 & done; wait
echo "builds done in $(( $(date +%s) - t0 )) s"; tail -n 2 $OUT/precompile_*.log
for v in t64x64_r4x4 t128x128_r8x8 t128x64_r8x4; do
  python3 profile_conv3d.py $C --device gpu ${P[$v]} --verify --compareprof --loadprecompiled --warmupiter 5 --totaliter 30 --outdir /tmp/tiles/$v > $OUT/profile_$v.log 2>&1
  echo "== $v rc=$?"; tail -n 12 $OUT/profile_$v.log
done
tar czf $OUT/tiles.tar.gz -C /tmp tiles
