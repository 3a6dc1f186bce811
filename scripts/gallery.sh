#!/usr/bin/env bash
# Regenerates the schedule gallery of docs/schedules.md: one SVG per built-in schedule
# at P=4, M=8 (V=2 where the schedule interleaves), unit costs F=1, B=2 (I=W=1), and
# zb-h1, zb-1p and zb-2p side by side with transfers of 0.5, and the searched V schedules.
# Usage: scripts/gallery.sh [path/to/pipesched]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/default/bin/pipesched}
[ -x "$bin" ] || { echo "gallery: $bin not built; run: cmake --preset default && cmake --build --preset default --target pipesched" >&2; exit 2; }
mkdir -p docs/img
for s in gpipe 1f1b interleaved-1f1b interleaved-zb looped-bfs zb-h1 zb-v dualpipe-v; do
  "$bin" simulate --schedule=$s --stages=4 --microbatches=8 --nogrid --svg=docs/img/$s.svg >/dev/null
  echo "docs/img/$s.svg"
done
# The searched schedules differ from zb-h1 only where costs are not unit: transfers of 0.5.
"$bin" compare --stages=4 --microbatches=8 --cost-comm=0.5 --schedules=zb-h1,zb-1p,zb-2p \
  --svg=docs/img/zb-search.svg >/dev/null
echo "docs/img/zb-search.svg"
# zb-v-1p against zb-v where zb-v's steady state is not reached: P=8, M=8.
"$bin" compare --stages=8 --microbatches=8 --schedules=zb-v,zb-v-1p --svg=docs/img/zb-v-search.svg >/dev/null
echo "docs/img/zb-v-search.svg"
# zb-v in less memory: zb-v-half and zb-v-min against zb-v and 1f1b at P=4, M=16.
"$bin" compare --stages=4 --microbatches=16 --schedules=zb-v,zb-v-half,zb-v-min,1f1b \
  --svg=docs/img/zb-v-memory.svg >/dev/null
echo "docs/img/zb-v-memory.svg"
