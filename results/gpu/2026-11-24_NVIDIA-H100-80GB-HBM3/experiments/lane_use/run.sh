#!/bin/bash
# After the lane-use order for element-wise kernels: implicitGemmNCDHW on CosmoFlow v1 b16
# (default tiles and 128x64/8x4), and directConvNCDHWBwdFilter on conv7 b16 (H100).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
C="--impl implicitGemmNCDHW --paramscsv cosmoflow --batch 16"
B="--param CTAtileM=128 --param threadTileM=8"
F="--impl directConvNCDHWBwdFilter --paramscsv cosmoflow --batch 16 --currlayer 6"
t0=$(date +%s)
python3 scripts/precompile.py $C --target gpu --jobs 8 > $OUT/precompile_default.log 2>&1 &
python3 scripts/precompile.py $C --target gpu $B --jobs 8 > $OUT/precompile_t128x64.log 2>&1 &
wait; echo "builds done in $(( $(date +%s) - t0 )) s"
python3 profile_conv3d.py $C --device gpu --verify --compareprof --loadprecompiled --warmupiter 5 --totaliter 30 --outdir /tmp/tiles2/t64x64_r4x4 > $OUT/profile_t64x64_r4x4.log 2>&1; echo "rc=$?"
python3 profile_conv3d.py $C $B --device gpu --verify --compareprof --loadprecompiled --warmupiter 5 --totaliter 30 --outdir /tmp/tiles2/t128x64_r8x4 > $OUT/profile_t128x64_r8x4.log 2>&1; echo "rc=$?"
python3 profile_conv3d.py $F --device gpu --verify --compareprof --warmupiter 5 --totaliter 30 --outdir /tmp/tiles2/bwdf > $OUT/profile_bwdf.log 2>&1; echo "rc=$?"
grep -hE "^\[|ms \(IQR" $OUT/profile_*.log | cut -c1-150
tar czf $OUT/tiles2.tar.gz -C /tmp tiles2
