# Helpers for the shell tests of the rxe and mesh suites.

# need_rdma: skip (77) unless an RDMA device is present, or the test's
# connections are set up over TCP (MW_TRANSPORT=tcp, or =auto where there
# is no RDMA: on loopback addresses unless MW_ADDRS says).
need_rdma() {
    local none=
    [[ -z $(ls /sys/class/infiniband 2>/dev/null) ]] && none=1
    if [[ ${MW_TRANSPORT:-} == tcp || (${MW_TRANSPORT:-} == auto && $none) ]]; then
        export MW_ADDRS=${MW_ADDRS:-127.0.0.1,127.0.0.2}
        return 0
    fi
    if [[ $none ]]; then
        echo "SKIP: no RDMA device here (run through tools/rxe-vm)"
        exit 77
    fi
}

# netdev_of_addr ADDR: the netdev carrying local address ADDR.
netdev_of_addr() {
    ip -o addr show | awk -v a="$1" '{split($4, p, "/"); if (p[1] == a) {print $2; exit}}' | grep .
}

# netdev_to PEER: the netdev the route to PEER (an address) leaves by.
netdev_to() {
    ip -o route get "$1" | awk '{for (i = 1; i < NF; i++) if ($i == "dev") print $(i + 1)}' | grep .
}

# rxe_of_addr ADDR: the RDMA device whose netdev carries ADDR.
rxe_of_addr() {
    local dev
    dev=$(netdev_of_addr "$1") || return 1
    rdma link show | awk -v d="$dev" '{for (i = 1; i < NF; i++) if ($i == "netdev" && $(i + 1) == d) {split($2, p, "/"); print p[1]; exit}}' | grep .
}

# sent_pkts RXE: packets the device has sent so far.
sent_pkts() {
    rdma statistic show link "$1/1" 2>/dev/null |
        tr ' ' '\n' | awk '$1 == "sent_pkts" {getline; print; exit}'
}

# same_24 A B: true when A and B share their first three octets.
same_24() { [[ ${1%.*} == "${2%.*}" ]]; }

# mesh_barrier NAME: wait (at most 180 s) until every node of the mesh got
# here, through files in MW_SHARED.
mesh_arrived() { (($(ls "$MW_SHARED" | grep -cF "barrier.$1.") >= MW_NODES)); }
mesh_barrier() {
    touch "$MW_SHARED/barrier.$1.$MW_NODE"
    retry 180 mesh_arrived "$1"
}

# retry SECS CMD...: run CMD until it succeeds or SECS pass.
retry() {
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}
