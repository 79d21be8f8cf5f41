#!/usr/bin/env bash
# The GPU kit, checked on THIS machine before device time is spent on it
# (kit_build.sh runs it last). In a private mount namespace where Open MPI's
# folder (plugins, libraries), HDF5's, PMIx's and hwloc's folders and orted are
# hidden, and so are Open MPI's help files, mpirun and orted (the GPU machine
# has none of them), kit_env.sh unpacks the kit and its `wiola` runs as the
# device will run it: --version, `prep` of a little Brown text, 2 training
# steps on the CPU backend with a checkpoint, `ckpt verify`; then the kit's
# mpirun runs 2 steps of tp2 on two ranks (kit_multi.sh's launch). Every
# object these runs load (the dynamic loader's own list, plugins included;
# mpirun's and every rank's) must come from the kit or be glibc's. Needs root
# (unshare -m); otherwise it says so and exits 0 without checking.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "kit_selftest: skipped (needs root and unshare -m)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
xz -dc data/brown/brown.txt.xz | head -c 200000 > "$work/brown.txt" || true  # xz: SIGPIPE
# The inner script from a file, not standard input, which mpirun forwards to
# rank 0 (it would eat the rest of the script).
cat > "$work/inner.sh" <<'INNER'
set -euo pipefail
work=$1
for d in /usr/lib/x86_64-linux-gnu/{openmpi,hdf5,pmix2,hwloc}; do
  [ -d "$d" ] && mount -t tmpfs none "$d"
done
for f in /usr/bin/orted /usr/bin/orterun; do [ -e "$f" ] && mount --bind /dev/null "$f"; done
[ -d /usr/share/openmpi ] && mount -t tmpfs none /usr/share/openmpi
export TMPDIR=$work OUT=$work/out
. tests/gpu/kit_env.sh || { echo "kit_selftest: kit_env.sh failed"; exit 1; }
w=$kit_bin/wiola
"$w" --version | head -3
"$w" prep --no-progress --tokenizer data/wiola360m/tokenizer.json --output "$work/shards" "$work/brown.txt" >/dev/null
# Every object the training run loads (plugins included) comes from the kit,
# or is glibc's: the dynamic loader's own list says which.
LD_DEBUG=files LD_DEBUG_OUTPUT=$work/ld "$w" train -q --set model.preset=wiola-tiny --set model.vocab_size=32000 \
  --set train.micro_batch=2 --set train.steps=2 --set train.threads=1 --set "data.path=$work/shards/manifest.json" \
  --set "train.run_dir=$work/run" --set "checkpoint.dir=$work/run/ck" --set checkpoint.every=2 >/dev/null
# Two ranks through the kit's mpirun (which must be the only one reachable).
if mpirun --version >/dev/null 2>&1; then echo "kit_selftest: the system's mpirun still runs"; exit 1; fi
LD_DEBUG=files LD_DEBUG_OUTPUT=$work/ld "$kit_mpirun" -n 2 --bind-to none "$w" train -q \
  --set model.preset=wiola-tiny --set model.vocab_size=32000 --set parallel.tp=2 --set train.micro_batch=2 \
  --set train.steps=2 --set train.threads=1 --set "data.path=$work/shards/manifest.json" \
  --set "train.run_dir=$work/run_tp2" --set "checkpoint.dir=$work/run_tp2/ck" --set checkpoint.every=2 >/dev/null
echo "kit_selftest: $(ls "$work"/ld.* | wc -l) processes traced (singleton, mpirun, 2 ranks)"
foreign=$(cat "$work"/ld.* | sed -n 's/.*calling init: //p' | sort -u | grep -v "^$work/" |
          grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libutil|libnss_[a-z]*)\.so|/ld-linux' || true)
[ -z "$foreign" ] || { echo "kit_selftest: loaded from outside the kit:"; echo "$foreign"; exit 1; }
echo "kit_selftest: $(cat "$work"/ld.* | sed -n 's/.*calling init: //p' | sort -u | grep -c "^$work/") objects" \
  "loaded from the kit, the rest glibc's"
"$w" ckpt verify "$work/run/ck" | tail -1
"$w" ckpt verify "$work/run_tp2/ck" | tail -1
INNER
unshare -m --propagation private bash "$work/inner.sh" "$work" < /dev/null
echo "kit_selftest: passed: the kit's wiola trained and checkpointed, alone and as 2 ranks under the kit's mpirun," \
  "with the system's Open MPI, HDF5, PMIx, mpirun and orted hidden"
