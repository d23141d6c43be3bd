#!/usr/bin/env bash
# Builds LedgerMQ's container image FROM scratch out of this checkout's binaries:
#   deploy/compose/build-image.sh [BIN_DIR]
# BIN_DIR holds mqbroker, mqnamesrv and mqadmin (default: target/release; build
# them first with `cargo build --release --bins`). The image is tagged
# $LEDGERMQ_IMAGE (default ledgermq:local). Needs docker and ldd; no registry.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin_dir=${1:-$here/../../target/release}
tag=${LEDGERMQ_IMAGE:-ledgermq:local}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp" "$root/var/lib/ledgermq"
chmod 1777 "$root/tmp"
for b in mqbroker mqnamesrv mqadmin; do
  [ -x "$bin_dir/$b" ] || { echo "build-image.sh: no $bin_dir/$b (cargo build --release --bins)" >&2; exit 1; }
  cp "$bin_dir/$b" "$root/usr/local/bin/$b"
done
# Every shared library the binaries load, and the loader itself, at the paths
# ldd names (symlinks followed, so each lands as a file).
for b in "$root"/usr/local/bin/*; do
  if ldd "$b" | grep -q "not found"; then
    echo "build-image.sh: $b needs a library this machine lacks:" >&2
    ldd "$b" | grep "not found" >&2
    exit 1
  fi
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
done | sort -u | while read -r lib; do
  cp -L --parents "$lib" "$root/"
done
# Names resolve from /etc/hosts, then DNS (docker's, for compose service names):
# glibc 2.34+ carries both in libc itself; an older one loads them at run time,
# so they go in too where they exist.
libc=$(ldd "$root/usr/local/bin/mqbroker" | awk '$1 ~ /^libc\.so/ { print $3 }')
for nss in "$(dirname "$libc")"/libnss_files.so.2 "$(dirname "$libc")"/libnss_dns.so.2; do
  if [ -e "$nss" ]; then cp -L --parents "$nss" "$root/"; fi
done
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
printf 'root:x:0:0:root:/:/usr/local/bin/mqadmin\n' > "$root/etc/passwd"
cp "$here/Dockerfile" "$ctx/Dockerfile"
# (the legacy builder's deprecation notice on stderr is shown only on failure)
if ! docker build --quiet --tag "$tag" "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  exit 1
fi
echo "built $tag from $bin_dir ($(du -sh "$root" | cut -f1))"
