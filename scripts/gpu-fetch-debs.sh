#!/usr/bin/env bash
# The system tools an offline GPU host lacks, as .deb files for its bundle (scripts/gpu-build-bundle.sh carries
# them; scripts/gpu-setup.sh unpacks them under /var/tmp/ratchet-tools): git (gitpython's workspaces), bubblewrap,
# iproute2 and iptables (the bwrap sandbox: own network namespace, host firewall rule), and every library they
# load but glibc. Downloaded with this machine's apt (Debian 12, glibc 2.36) into .whl/deb (or $1).
#
# Why Debian 12's and not Ubuntu 24.04's (the host image's distribution, glibc 2.39): a program built against
# glibc 2.36 runs on 2.39, not the other way, so these also run here, where they are tested; Ubuntu 24.04's .debs
# are zstd-compressed where Debian 12's are xz. The libraries come along and are loaded from the unpacked folder
# (sandbox/host_tools.py runs each tool through the host's loader with --library-path), so nothing but glibc
# is taken from the host. Dependencies checked (dpkg -I, Debian 12 amd64): git: libc6, libpcre2-8-0, zlib1g
# (libcurl3-gnutls, libexpat1, perl only for remotes, hooks and `add -p`: not used); bubblewrap: libc6, libcap2,
# libselinux1; iproute2: libbpf1, libbsd0, libc6, libcap2, libdb5.3, libelf1, libmnl0, libselinux1, libtirpc3,
# libxtables12 (the `ip` binary itself needs libbpf, libelf, libmnl, libbsd, libcap); iptables: libip4tc2,
# libip6tc2, libxtables12, libmnl0, libnftnl11, libnetfilter-conntrack3, libnfnetlink0. The check below follows
# the ELF NEEDED entries of the binaries the sandbox runs and fails if any library but glibc's is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.whl/deb}
PACKAGES=(git bubblewrap iproute2 iptables libcap2 libselinux1 libpcre2-8-0 libbpf1 libelf1 zlib1g
          libmnl0 libbsd0 libmd0 libxtables12 libip4tc2 libip6tc2 libnftnl11 libnetfilter-conntrack3 libnfnetlink0)
GLIBC='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64)\.so'
mkdir -p "$OUT"
rm -f "$OUT"/*.deb
(cd "$OUT" && apt-get download -q "${PACKAGES[@]}")
for deb in "$OUT"/*.deb; do
  printf '%s: %s\n' "$(basename "$deb")" "$(dpkg-deb -f "$deb" Depends)"
done
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
for deb in "$OUT"/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
# The binaries the sandbox and the workspaces run, and iptables' extensions (loaded at run time).
mapfile -t ELVES < <(printf '%s\n' "$ROOT"/usr/bin/git "$ROOT"/usr/bin/bwrap "$ROOT"/bin/ip "$ROOT"/usr/sbin/ip \
  "$ROOT"/usr/sbin/xtables-nft-multi "$ROOT"/usr/sbin/xtables-legacy-multi "$ROOT"/usr/lib/x86_64-linux-gnu/xtables/libxt_*.so | while read -r f; do
  [ -e "$f" ] && echo "$f"; done)
missing=0
seen=" "
queue=("${ELVES[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [[ $lib =~ $GLIBC ]] && continue
    [[ $seen == *" $lib "* ]] && continue
    seen+="$lib "
    found=$(find "$ROOT" -name "$lib" | head -1)
    if [ -z "$found" ]; then echo "missing: $lib (needed by ${f#"$ROOT"})"; missing=1; else queue+=("$found"); fi
  done
done
[ "$missing" = 0 ] || { echo "add the packages holding the libraries above to PACKAGES"; exit 1; }
echo "${#ELVES[@]} binaries checked; libraries shipped:$seen"
du -ch "$OUT"/*.deb | tail -1
