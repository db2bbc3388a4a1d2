#!/usr/bin/env bash
# Builds the base image debian:bookworm without a container registry:
# debootstrap (minbase) from the Debian mirror this machine's apt uses, then
# `tar | docker import`. For machines that reach Debian's archive but not
# Docker Hub; scripts/test-deploy.sh calls it when `docker pull` fails.
#
#   scripts/build-base-image.sh [TAG]        (default TAG: debian:bookworm)
#
# Environment: SHOAL_DEBIAN_MIRROR overrides the mirror (default: the first
# bookworm URI in /etc/apt/sources.list or /etc/apt/sources.list.d/*, else
# http://deb.debian.org/debian); DOCKER (default: docker) is the client.
# Needs root (debootstrap) and a running Docker engine.
set -euo pipefail

TAG="${1:-debian:bookworm}"
SUITE=bookworm
DOCKER="${DOCKER:-docker}"

log() { echo "build-base-image: $*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (debootstrap)"
  exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
    </dev/null >/dev/null
fi

# Prints the URIs of every apt source (one-line and deb822 formats) whose
# suite is $1, first one first.
apt_uris_for_suite() {
  local suite="$1" f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
      awk -v s="$suite" '$1 == "deb" && $3 == s { print $2 }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    # Stanzas separated by blank lines; fields Types, URIs, Suites, Enabled.
    awk -v s="$suite" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && enabled != "no") {
          n = split(suites, ss, " ")
          for (i = 1; i <= n; i++) if (ss[i] == s) { m = split(uris, us, " "); for (j = 1; j <= m; j++) print us[j] }
        }
        types = ""; uris = ""; suites = ""; enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "", $0)
        if (key == "types") types = $0; else if (key == "uris") uris = $0
        else if (key == "suites") suites = $0; else if (key == "enabled") enabled = tolower($0) }
      END { flush() }' "$f"
  done
}

MIRROR="${SHOAL_DEBIAN_MIRROR:-$(apt_uris_for_suite "$SUITE" | head -n1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SECURITY="$(apt_uris_for_suite "$SUITE-security" | head -n1)"
log "suite $SUITE from $MIRROR${SECURITY:+ (security: $SECURITY)} -> image $TAG"

ROOTFS="$(mktemp -d /tmp/shoal-rootfs.XXXXXX)"
cleanup() {
  # debootstrap may leave /proc or /sys mounted after a failure.
  for m in proc sys dev/pts dev; do
    mountpoint -q "$ROOTFS/$m" 2>/dev/null && umount -l "$ROOTFS/$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$ROOTFS"
}
trap cleanup EXIT

KEYRING=()
if [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]]; then
  KEYRING=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
fi

start=$(date +%s)
if ! debootstrap --variant=minbase "${KEYRING[@]}" "$SUITE" "$ROOTFS" "$MIRROR" \
    >"$ROOTFS.log" 2>&1; then
  tail -n 30 "$ROOTFS.log" >&2
  log "debootstrap failed (full log: $ROOTFS.log)"
  exit 1
fi
rm -f "$ROOTFS.log"
log "debootstrap done in $(($(date +%s) - start))s"

# Apt sources like the official image: the suite, its updates and security.
rm -f "$ROOTFS/etc/apt/sources.list"
{
  echo "Types: deb"
  echo "URIs: $MIRROR"
  echo "Suites: $SUITE $SUITE-updates"
  echo "Components: main"
  echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
  if [[ -n "$SECURITY" ]]; then
    echo
    echo "Types: deb"
    echo "URIs: $SECURITY"
    echo "Suites: $SUITE-security"
    echo "Components: main"
    echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
  fi
} >"$ROOTFS/etc/apt/sources.list.d/debian.sources"
# As in the official image: no cached .debs, no translations.
cat >"$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' >"$ROOTFS/etc/apt/apt.conf.d/docker-no-languages"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
  "$ROOTFS"/var/log/* "$ROOTFS"/tmp/* "$ROOTFS"/dev/* 2>/dev/null || true
: >"$ROOTFS/etc/hostname"
: >"$ROOTFS/etc/resolv.conf"

tar --numeric-owner --xattrs -C "$ROOTFS" -c . |
  "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase $SUITE $MIRROR" \
    - "$TAG" >/dev/null
log "imported $TAG ($("$DOCKER" image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')) in $(($(date +%s) - start))s"
