#!/usr/bin/env bash
# The main job, on a fresh Debian machine: build pipesched, simulate the built-in
# schedules, rank them at equal work and write their pictures to out/, then train a
# small pipeline (host backend, or the GPU when one is usable).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
preset=default
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target pipesched
bin=build/$preset/bin/pipesched
mkdir -p out
echo "== pipesched schedules"
$bin schedules
echo
echo "== 1F1B, P=4, M=8: grid, stats, pictures"
$bin simulate --schedule=1f1b --stages=4 --microbatches=8 \
  --svg=out/1f1b.svg --trace=out/1f1b.trace.json --csv=out/1f1b.csv --json=out/1f1b.stats.json
for s in gpipe interleaved-1f1b interleaved-zb zb-h1 zb-v; do
  echo
  echo "== $s, P=4, M=8"
  $bin simulate --schedule=$s --stages=4 --microbatches=8 --nogrid --svg=out/$s.svg
done
echo
echo "== compare: every schedule at equal work (per-stage F=1, B=2, transfer 0.05), P=4, M=8"
$bin compare --stages=4 --microbatches=8 --cost-comm=0.05 --svg=out/compare.svg
if $bin help train >/dev/null 2>&1; then
  echo
  echo "== train: 1F1B, P=2, M=8 on --backend=auto"
  $bin train --schedule=1f1b --stages=2 --microbatches=8 --microbatch-size=16 --layers=4 \
    --hidden=128 --steps=20 --backend=auto --svg=out/train-1f1b.svg --trace=out/train-1f1b.trace.json
fi
echo
echo "pictures and traces are in out/ (open the .svg in a browser, the .trace.json in ui.perfetto.dev)"
