#!/usr/bin/env bash
# The GPU bundle on a machine that has none of this project's Debian libraries: builds it
# (tools/gpu-bundle), checks its size and manifest, and runs it inside a bare Debian 12 root
# (tools/build-debian-root, cached outside the repository) into which only the bundle and the CUDA
# toolkit's runtime libraries (cudart, cuBLAS, cuBLASLt, NCCL) are copied:
#   - every packed binary resolves every library (ldd: nothing "not found") and starts;
#   - the host-side CUDA tests pass there; each CUDA check exits 77 (no GPU);
#   - the entry script exits 77 with "no GPU visible" (and its summary says so); it refuses (exit 3) a
#     glibc older than the bundle needs and a machine without the CUDA runtime libraries;
#   - with one packed library removed, the same ldd check fails (so it can fail).
# Needs root (chroot, mount) and about 10-25 minutes on 2 cores the first time (the CUDA build);
# ctest label `bundle`, defined only with -DMEGATRAIN_BUNDLE_TEST=ON (README "GPU bundle").
#   tests/tools/gpu_bundle_test.sh [BUNDLE.tar.xz]     (given: test that bundle, build nothing)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" = 0 ] || { echo "gpu_bundle_test: needs root (chroot)"; exit 1; }
cuda_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle-test.XXXXXX")
sysroot=$work/root
cleanup() {
  mountpoint -q "$sysroot/proc" && umount "$sysroot/proc"
  mountpoint -q "$sysroot/dev" && umount "$sysroot/dev"
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
check() {  # description, command...
  local what=$1
  shift
  if "$@"; then echo "PASS $what"; else echo "FAIL $what"; failures=$((failures + 1)); fi
}

bundle=${1:-}
if [ -z "$bundle" ]; then
  bundle=$work/megatrain-gpu-check.tar.xz
  t0=$SECONDS
  "$root/tools/gpu-bundle" "$bundle"
  echo "gpu_bundle_test: bundle built in $((SECONDS - t0)) s"
fi

# --- the archive and its manifest
size=$(stat -c %s "$bundle")
check "archive is $size bytes, at most 40 MiB" test "$size" -le $((40 * 1024 * 1024))
check "archive is xz (plain tar -xJf)" sh -c "xz -t '$bundle'"
mkdir -p "$work/unpacked"
tar -xJf "$bundle" -C "$work/unpacked"
b=$work/unpacked/megatrain-gpu-check
for f in gpu-check stages MANIFEST.txt GLIBC_REQUIRED CUDA_LIBRARIES data/demo.ini data/tokenizer.json \
  data/train_000000.bin data/val_000000.bin; do
  check "bundle holds $f" test -s "$b/$f"
done
needed_all=$(for f in "$b"/bin/* "$b"/lib/*; do objdump -p "$f" | awk '$1 == "NEEDED" { print $2 }'; done | sort -u)
for l in "$b"/lib/*; do
  n=${l##*/}
  check "lib/$n is needed by a packed file" grep -qxF "$n" <<<"$needed_all"
  check "lib/$n is in the manifest" grep -q "^  $n " "$b/MANIFEST.txt"
  check "lib/$n is no machine library (glibc, libcuda, CUDA runtime)" \
    sh -c "! echo '$n' | grep -qE '^(libc|libm|libdl|librt|libpthread|ld-linux.*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'"
done
for f in "$b"/bin/*; do
  check "bin/${f##*/} is in the manifest" grep -q "^  ${f##*/} " "$b/MANIFEST.txt"
  check "bin/${f##*/} has RPATH \$ORIGIN/../lib" sh -c "objdump -p '$f' | grep -q 'RPATH *\\\$ORIGIN/../lib\$'"
done
for want in megatrain megatrain-ckpt bench_gpu test_kernels_cuda_launch test_kernels_backend test_backend_ops check_cuda_adamw \
  check_cuda_stages check_cuda_engine check_cuda_nccl check_cuda_multi_gpu; do
  check "bundle holds bin/$want" test -x "$b/bin/$want"
done
for f in "$b"/lib/*; do
  check "lib/${f##*/} has RPATH \$ORIGIN" sh -c "objdump -p '$f' | grep -q 'RPATH *\\\$ORIGIN\$'"
done

# --- a bare Debian 12 root with only the bundle and the CUDA runtime libraries
template=$("$root/tools/build-debian-root")
cp -a "$template" "$sysroot"
mkdir -p "$sysroot/usr/local/cuda/lib64" "$sysroot/opt"
while read -r lib; do
  check "the CUDA toolkit here has $lib" test -e "$cuda_lib/$lib"
  # The name and every file its links lead to (libcublasLt.so.13 -> libcublasLt.so.13.x.y).
  cp -a "$cuda_lib/$lib" "$sysroot/usr/local/cuda/lib64/"
  cp -a "$(realpath "$cuda_lib/$lib")" "$sysroot/usr/local/cuda/lib64/"
done <"$b/CUDA_LIBRARIES"
tar -xJf "$bundle" -C "$sysroot/opt"
mount -t proc proc "$sysroot/proc"
mount --bind /dev "$sysroot/dev"
in_root() { chroot "$sysroot" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
# minbase itself has a few (libstdc++, libgcc_s, zlib, zstd, pcre2, xxhash: apt's and grep's); the ldd
# check below requires the binaries to take every library but the machine's from the bundle's lib/.
check "the root has none of the project's other Debian libraries" \
  sh -c "! ls '$sysroot'/usr/lib/x86_64-linux-gnu/ | grep -qE '^lib(caf_|hdf5|dnnl|openblas|gomp|boost|icu|prometheus|gfortran|curl)'"
echo "gpu_bundle_test: Debian root $(in_root cat /etc/debian_version), $(in_root getconf GNU_LIBC_VERSION)"

cb=/opt/megatrain-gpu-check
# Every packed binary: ldd inside the root finds every library, and each one that is not glibc's in the
# bundle's lib/ or the CUDA directory (none from the root's /usr/lib, even where minbase has it too).
resolves_all() {
  local ok=0 f out stray
  for f in "$sysroot$cb"/bin/*; do
    out=$(in_root env LD_LIBRARY_PATH=/usr/local/cuda/lib64 ldd "$cb/bin/${f##*/}" 2>&1) || true
    if grep -q "not found" <<<"$out"; then
      echo "  ${f##*/}: $(grep "not found" <<<"$out" | tr -s ' \t' ' ' | paste -sd';')"
      ok=1
    fi
    stray=$(awk '$2 == "=>" && $3 != "not" && $3 !~ "^('"$cb"'/(bin/\\.\\./)?lib/|/usr/local/cuda/lib64/)" { print $1 }' <<<"$out" \
      | grep -vE '^(libc|libm|libdl|librt|libpthread|libresolv)\.so' || true)
    if [ -n "$stray" ]; then
      echo "  ${f##*/} loads from outside the bundle: $(paste -sd' ' <<<"$stray")"
      ok=1
    fi
  done
  return $ok
}
check "every packed binary finds every library in the bare root (ldd)" resolves_all
run_in_root() {  # expected exit, binary and arguments
  local want=$1 name=$2 s=0
  shift 2
  in_root env LD_LIBRARY_PATH=/usr/local/cuda/lib64 "$cb/bin/$name" "$@" >"$work/run.log" 2>&1 || s=$?
  [ "$s" = "$want" ] || { echo "  $name $* exited $s, expected $want:"; tail -n 15 "$work/run.log"; return 1; }
}
check "megatrain starts (train --help)" run_in_root 0 megatrain train --help
check "megatrain-ckpt starts (--help)" run_in_root 0 megatrain-ckpt --help
check "host-side CUDA tests pass in the bare root" run_in_root 0 test_kernels_cuda_launch
check "backend selection tests pass in the bare root" run_in_root 0 test_kernels_backend
check "the op test passes on the CPU ops in the bare root" run_in_root 0 test_backend_ops --backend cpu --precision bf16
check "the op test on CUDA starts and skips (77: no GPU)" run_in_root 77 test_backend_ops --backend cuda --precision fp32
for c in check_cuda_adamw check_cuda_stages check_cuda_engine check_cuda_nccl check_cuda_multi_gpu; do
  check "$c starts and skips (77: no GPU)" run_in_root 77 "$c"
done
s=0
in_root env LD_LIBRARY_PATH=/usr/local/cuda/lib64 "$cb/bin/bench_gpu" >"$work/run.log" 2>&1 || s=$?
check "bench_gpu exits 1 naming the missing GPU" sh -c "[ $s = 1 ] && grep -q 'no usable GPU' '$work/run.log'"

# --- the entry script
s=0
in_root "$cb/gpu-check" --out /tmp/out >"$work/entry.log" 2>&1 || s=$?
cat "$work/entry.log"
check "gpu-check exits 77 (no GPU visible)" test "$s" = 77
check "gpu-check says: no GPU visible" grep -q "no GPU visible" "$work/entry.log"
check "gpu-check found the CUDA runtime in /usr/local/cuda/lib64" grep -q "CUDA runtime: libcudart.so.* -> /usr/local/cuda/lib64/" "$work/entry.log"
check "gpu-check printed glibc's version" grep -q "^glibc: this machine 2.36, the bundle needs >= " "$work/entry.log"
check "gpu-check's host-tests stage passed" grep -q '"name": "host-tests", "status": "passed"' "$sysroot/tmp/out/summary.json"
check "gpu-check's summary is JSON" python3 -m json.tool "$sysroot/tmp/out/summary.json" /dev/null
check "gpu-check's summary says no_gpu" grep -q '"result": "no_gpu"' "$sysroot/tmp/out/summary.json"
check "gpu-check wrote its whole log" grep -q "no GPU visible" "$sysroot/tmp/out/gpu-check.log"
s=0
in_root env MEGATRAIN_GLIBC_VERSION=2.17 "$cb/gpu-check" --out /tmp/out2 >"$work/entry.log" 2>&1 || s=$?
check "gpu-check refuses glibc 2.17 (exit 3, named)" sh -c "[ $s = 3 ] && grep -q 'glibc 2.17 is older than' '$work/entry.log'"
check "gpu-check's refusal summary is JSON, result refused" \
  sh -c "python3 -m json.tool '$sysroot/tmp/out2/summary.json' >/dev/null && grep -q '\"result\": \"refused\"' '$sysroot/tmp/out2/summary.json'"
s=0
in_root env MEGATRAIN_CUDA_LIB_DIRS=/nowhere "$cb/gpu-check" --out /tmp/out3 >"$work/entry.log" 2>&1 || s=$?
check "gpu-check refuses a machine without the CUDA runtime (exit 3, named)" \
  sh -c "[ $s = 3 ] && grep -q 'the CUDA runtime libraries .*libcudart' '$work/entry.log'"

# --- the ldd check can fail: leave one packed library out
victim=$(find "$sysroot$cb/lib" -name 'libcaf_core.so*' | head -n1)
check "the bundle packs libcaf_core" test -n "$victim"
if [ -n "$victim" ]; then
  rm -f "$victim"
  left_out_fails() { ! resolves_all; }
  check "with ${victim##*/} left out, the ldd check reports it not found" left_out_fails
fi

echo
[ "$failures" = 0 ] || { echo "gpu_bundle_test: $failures checks FAILED"; exit 1; }
echo "gpu_bundle_test: all checks passed"
