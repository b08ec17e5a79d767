#!/usr/bin/env bash
# tools/check-layers must fail on a planted upward include, on CAF in a CAF-free layer and on MPI
# outside the MPI layers, naming the file and line, and pass on the same tree without them (so the
# tree's own pass means something; storage/m.cpp includes MPI where the planted tree allows it).
set -euo pipefail
checker=$1
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/kernels" "$root/storage" "$root/actors"
printf 'set(MEGATRAIN_LAYERS kernels storage actors)\nset(MEGATRAIN_CAF_FREE_LAYERS kernels storage)\nset(MEGATRAIN_MPI_LAYERS storage)\n' >"$root/CMakeLists.txt"
printf '#include "kernels/a.hpp"\n' >"$root/storage/s.hpp"
printf '#include "storage/s.hpp"\n#include <caf/all.hpp>\n' >"$root/actors/x.cpp"
printf '#pragma once\n' >"$root/kernels/a.hpp"
printf '#include <mpi.h>\n' >"$root/storage/m.cpp"
"$checker" "$root" >/dev/null || { echo "FAIL: a clean tree was refused"; exit 1; }

printf '#include "actors/x.hpp"\n' >>"$root/kernels/a.hpp"
if out=$("$checker" "$root" 2>&1); then echo "FAIL: an upward include passed"; exit 1; fi
grep -q 'kernels/a.hpp:2: includes "actors/x.hpp"' <<<"$out" || { echo "FAIL: not named: $out"; exit 1; }

printf '#pragma once\n' >"$root/kernels/a.hpp"
printf '#include <caf/actor.hpp>\n' >"$root/storage/s.hpp"
if out=$("$checker" "$root" 2>&1); then echo "FAIL: CAF in storage/ passed"; exit 1; fi
grep -q 'storage/s.hpp:1: includes <caf/actor.hpp>' <<<"$out" || { echo "FAIL: not named: $out"; exit 1; }
printf '#pragma once\n' >"$root/storage/s.hpp"
printf '#include <mpi.h>\n' >>"$root/actors/x.cpp"
if out=$("$checker" "$root" 2>&1); then echo "FAIL: MPI in actors/ passed"; exit 1; fi
grep -q 'actors/x.cpp:3: includes <mpi.h>' <<<"$out" || { echo "FAIL: not named: $out"; exit 1; }
echo "check-layers refuses planted upward, CAF and MPI includes"
