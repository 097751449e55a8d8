# Shared by the scripts in docker/, tests/docker/ and bench/docker_build.sh (sourced, not run).

# Sets DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR, unless they are already set, to the mirrors this
# host's apt uses for bookworm and bookworm-security (one-line *.list files and deb822 *.sources
# files), so that image builds download from the same place as the host. Falls back to
# deb.debian.org.
fedfleet_debian_mirrors() {
  local files=() f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] && files+=("$f")
  done
  local found=""
  if ((${#files[@]})); then
    # Prints "<suite> <uri>" for every Debian suite this host fetches.
    found=$(awk '
      function flush(  n, k, s, u) {
        if (uris != "" && suites != "") {
          n = split(suites, s, /[ \t]+/); split(uris, u, /[ \t]+/)
          for (k = 1; k <= n; k++) print s[k], u[1]
        }
        uris = ""; suites = ""
      }
      FNR == 1 { flush() }
      /^[ \t]*deb[ \t]/ {
        i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
        print $(i + 1), $i; next
      }
      /^URIs:/ { uris = $0; sub(/^URIs:[ \t]*/, "", uris) }
      /^Suites:/ { suites = $0; sub(/^Suites:[ \t]*/, "", suites) }
      /^[ \t]*$/ { flush() }
      END { flush() }
    ' "${files[@]}" 2>/dev/null || true)
  fi
  if [ -z "${DEBIAN_MIRROR:-}" ]; then
    DEBIAN_MIRROR=$(awk '$1 == "bookworm" { print $2; exit }' <<<"$found")
    DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  fi
  if [ -z "${DEBIAN_SECURITY_MIRROR:-}" ]; then
    DEBIAN_SECURITY_MIRROR=$(awk '$1 == "bookworm-security" { print $2; exit }' <<<"$found")
    DEBIAN_SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
  fi
  DEBIAN_MIRROR=${DEBIAN_MIRROR%/}
  DEBIAN_SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR%/}
  export DEBIAN_MIRROR DEBIAN_SECURITY_MIRROR
}

# Prints the compose command available here: the v2 plugin (`docker compose`) when it works,
# else compose v1 (`docker-compose`, the Debian bookworm package). Returns 1 when neither exists.
fedfleet_compose_command() {
  if docker compose version > /dev/null 2>&1; then
    echo "docker compose"
  elif command -v docker-compose > /dev/null 2>&1; then
    echo "docker-compose"
  else
    return 1
  fi
}

# Makes a Docker engine available. Uses the one that answers (DOCKER_HOST or the default socket)
# and returns 0; otherwise starts `dockerd --bridge=none --iptables=false` with its data root,
# exec root, socket and log under DIR (keep DIR short: containerd's socket path lives there),
# exports DOCKER_HOST, sets FEDFLEET_ENGINE_PID and returns 0 once it answers. Returns 1 when
# none can be used (no dockerd, not root, or it did not come up; its log tail is printed).
fedfleet_engine_up() {
  local dir=$1
  FEDFLEET_ENGINE_PID=""
  if docker info > /dev/null 2>&1; then return 0; fi
  command -v dockerd > /dev/null || PATH=$PATH:/usr/sbin:/sbin
  if ! command -v dockerd > /dev/null; then
    echo "no Docker engine runs and dockerd is not installed" >&2
    return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "no Docker engine runs and starting dockerd needs root" >&2
    return 1
  fi
  mkdir -p "$dir"
  export DOCKER_HOST="unix://$dir/docker.sock"
  dockerd --bridge=none --iptables=false --ip-masq=false \
    --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
    --host "$DOCKER_HOST" > "$dir/dockerd.log" 2>&1 &
  FEDFLEET_ENGINE_PID=$!
  local _
  for _ in $(seq 1 120); do
    docker info > /dev/null 2>&1 && return 0
    kill -0 "$FEDFLEET_ENGINE_PID" 2> /dev/null || break
    sleep 0.5
  done
  tail -n 20 "$dir/dockerd.log" >&2
  echo "dockerd did not start (log above)" >&2
  fedfleet_engine_down "$dir"
  return 1
}

# Stops the engine fedfleet_engine_up started (if it started one) and removes DIR, unmounting
# what the engine left mounted there.
fedfleet_engine_down() {
  local dir=$1 _ m
  if [ -n "${FEDFLEET_ENGINE_PID:-}" ]; then
    kill -TERM "$FEDFLEET_ENGINE_PID" 2> /dev/null
    for _ in $(seq 1 60); do kill -0 "$FEDFLEET_ENGINE_PID" 2> /dev/null || break; sleep 0.5; done
    kill -KILL "$FEDFLEET_ENGINE_PID" 2> /dev/null || true
    FEDFLEET_ENGINE_PID=""
    awk -v d="$dir" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
      while read -r m; do umount -l "$m" 2> /dev/null || true; done
  fi
  rm -rf "$dir"
}
