# Hosts as Linux network namespaces on this machine, for multi-host tests
# (tests/e2e_dist_multihost*.sh), sourced after tests/dist_lib.sh. Each host is a namespace with
# its own loopback and one veth link "eth0" (address 10.77.0.K+1/24) to a bridge in a switch
# namespace, so its ranks reach the others only over TCP through that link, which a test can
# cut (mh_link K down). mpirun starts in host 0's namespace and reaches host K through
# plm_rsh_agent, a script that runs the daemon's command in host K's namespace (ssh's part);
# Open MPI is held to its TCP transport (btl tcp,self: no shared memory between hosts) on the
# 10.77.0.0/24 links, for messages and for its own out-of-band channel. Once every rank has
# ended after a cut link, mpirun still waits for its daemon on the far side: TCP gives up on
# it after keepalives (idle connection: oob_tcp_keepalive_*, 12 + 3 x 2 s here instead of
# Open MPI's 300 + 9 x 20 s) or retransmissions (data in flight: tcp_retries2, set to 5,
# about 13 s, inside the hosts' namespaces instead of Linux's 15, about 15 minutes).
#
#   mh_setup N        creates hosts 0..N-1 and their hostfile $TMP/mh_hosts (one slot each),
#                     or exits 77 with a sentence where namespaces cannot be made (not root,
#                     no `ip`, no netns or veth support). Every namespace it made, and every
#                     process left inside one, is removed on exit (the trap covers
#                     dist_lib.sh's $TMP too).
#   "${MH_MPIRUN[@]}" -np NP PROGRAM ARGS
#                     mpirun across the hosts (ranks in host order, one slot per host).
#   mh_run NAME ARGS  `qtitan train ARGS` on one rank per host into $TMP/NAME, log
#                     $TMP/NAME.log, bounded at 60 s (a run that hits it says so).
#   mh_link K up|down sets host K's link up or down (from the switch's side).
#   mh_ranks_alive    the number of qtitan processes still running inside the hosts.
MH_PREFIX="qtmh$$"
MH_HOSTS=0
MH_VETHS=0
MH_MADE=()
MH_MPIRUN=()
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN") # the daemons start elsewhere

mh_cleanup() {
  local ns p k
  for ns in "${MH_MADE[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for ns in "${MH_MADE[@]}"; do ip netns del "$ns" 2>/dev/null; done
  # a veth pair that set-up made but did not move into the namespaces yet
  for ((k = 0; k < MH_VETHS; k++)); do ip link del "${MH_PREFIX}e$k" 2>/dev/null; done
  rm -rf "$TMP"
}
trap mh_cleanup EXIT
trap "exit 130" INT TERM HUP # so that the EXIT trap runs on these too

mh_setup() {
  local n=$1 k
  [ "$(id -u)" = 0 ] || { echo "skip: network namespaces need root (ip netns add)"; exit 77; }
  command -v ip >/dev/null || { echo "skip: no 'ip' command (iproute2) to make network namespaces"; exit 77; }
  local sw="${MH_PREFIX}sw"
  if ! ip netns add "$sw" 2>"$TMP/mh.err"; then
    echo "skip: cannot create a network namespace: $(cat "$TMP/mh.err")"; exit 77
  fi
  MH_MADE+=("$sw")
  if ! ip -n "$sw" link add br0 type bridge 2>"$TMP/mh.err" || ! ip -n "$sw" link set br0 up; then
    echo "skip: cannot create a bridge in a network namespace: $(cat "$TMP/mh.err")"; exit 77
  fi
  : >"$TMP/mh_hosts"
  {
    echo '#!/bin/sh'
    echo '# plm_rsh_agent: "agent HOST COMMAND..." runs COMMAND in HOST'"'"'s namespace, as ssh would on HOST'
    echo 'host=$1; shift'
    echo 'case $host in'
  } >"$TMP/mh_agent"
  for ((k = 0; k < n; k++)); do
    local h="${MH_PREFIX}h$k"
    ip netns add "$h" || { echo "FAIL: ip netns add $h"; exit 1; }
    MH_MADE+=("$h")
    if ! ip link add "${MH_PREFIX}e$k" type veth peer name "${MH_PREFIX}s$k" 2>"$TMP/mh.err"; then
      echo "skip: cannot create a veth pair: $(cat "$TMP/mh.err")"; exit 77
    fi
    MH_VETHS=$((k + 1))
    ip link set "${MH_PREFIX}e$k" netns "$h" &&
      ip link set "${MH_PREFIX}s$k" netns "$sw" &&
      ip -n "$h" link set "${MH_PREFIX}e$k" name eth0 &&
      ip -n "$h" addr add "10.77.0.$((k + 1))/24" dev eth0 &&
      ip -n "$h" link set eth0 up && ip -n "$h" link set lo up &&
      ip netns exec "$h" sh -c "echo 5 >/proc/sys/net/ipv4/tcp_retries2" &&
      ip -n "$sw" link set "${MH_PREFIX}s$k" master br0 &&
      ip -n "$sw" link set "${MH_PREFIX}s$k" up || { echo "FAIL: wiring host $k"; exit 1; }
    echo "10.77.0.$((k + 1)) slots=1" >>"$TMP/mh_hosts"
    echo "10.77.0.$((k + 1))) ns=$h;;" >>"$TMP/mh_agent"
  done
  {
    echo '*) echo "mh_agent: unknown host $host" >&2; exit 1;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" /bin/sh -c "$*"'
  } >>"$TMP/mh_agent"
  chmod +x "$TMP/mh_agent"
  MH_HOSTS=$n
  MH_MPIRUN=(ip netns exec "${MH_PREFIX}h0" mpirun --hostfile "$TMP/mh_hosts"
    --mca plm_rsh_agent "$TMP/mh_agent" --mca pml ob1 --mca btl tcp,self
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
    --mca oob_tcp_keepalive_time 12 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3)
}

mh_run() {
  local name=$1 rc
  shift
  timeout 60 "${MH_MPIRUN[@]}" -np "$MH_HOSTS" "$BIN" train "$@" --job.dump_folder="$TMP/$name" >"$TMP/$name.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && echo "FAIL: multi-host run $name did not end within 60 s"
  return $rc
}

mh_link() { ip -n "${MH_PREFIX}sw" link set "${MH_PREFIX}s$1" "$2"; }

mh_ranks_alive() {
  local ns p n=0
  for ns in "${MH_MADE[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = qtitan ] && n=$((n + 1))
    done
  done
  echo "$n"
}
