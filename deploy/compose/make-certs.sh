#!/bin/sh
# The certificates of deploy/compose, made with deploy/local-secure/make-certs.sh
# (openssl) into OUT_DIR (default deploy/compose/certs), whose files
# docker-compose.yml mounts at /etc/ledgermq/certs (from $LEDGERMQ_CERTS when
# set, else ./certs):
#
#   deploy/compose/make-certs.sh [OUT_DIR]
#
# A development CA (certs/ca.pem: what clients trust), one certificate per
# broker node naming its address and its group's network alias (broker-a,
# broker-b: the name routes give clients), and one for both name servers.
# Run it again to replace them all; restart the containers after. One CA
# for both groups: a node of either group is accepted on the other's Raft
# port. In production give each group a CA of its own (and put the name
# servers' CA beside it in each node's ca_file). The addresses are
# docker-compose.yml's: change them together.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/certs}
# `docker-compose up` before the certificates exist makes each missing file a
# directory, which openssl cannot replace.
for f in "$out"/*.pem; do
    if [ -d "$f" ]; then
        echo "make-certs.sh: $f is a directory (docker-compose up ran before the" \
            "certificates existed): remove $out and run this again" >&2
        exit 1
    fi
done
set --
for g in a b; do
    for i in 0 1 2; do
        ip=10.213.0.$([ "$g" = a ] && echo 2 || echo 3)$i
        set -- "$@" "$g$i=IP:$ip,DNS:broker-$g"
    done
done
exec sh "$here/../local-secure/make-certs.sh" "$out" "$@" \
    namesrv=IP:10.213.0.11,IP:10.213.0.12
