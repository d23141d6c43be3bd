#!/bin/sh
# A development certificate authority and one certificate per node for
# deploy/local-secure (TLS on the client ports, mutual TLS on the Raft ports,
# TLS on the name server), made with openssl:
#
#   deploy/local-secure/make-certs.sh [OUT_DIR [NAME=SANS ...]]
#
# OUT_DIR (default: deploy/local-secure/certs) gets ca.pem (the CA certificate
# clients and members trust), ca-key.pem (keep it, or delete it once the node
# certificates are made), and NAME.pem / NAME-key.pem for each NAME=SANS given
# (SANS: openssl subjectAltName entries, e.g. host1=IP:10.0.0.11,DNS:mq1.example),
# by default n0, n1, n2 and namesrv naming IP:127.0.0.1,DNS:localhost. P-256
# keys, certificates valid for 825 days, for server and client authentication
# (a NAME starting with `namesrv`: server authentication only, so it cannot
# pass for a member on the Raft ports). For real hosts, name each host's
# addresses, give every group a CA of its own, and keep the CA key off the
# brokers.
set -eu
out=${1:-$(dirname "$0")/certs}
case $out in
    *=*) echo "make-certs.sh: the first argument is OUT_DIR, not $out" >&2; exit 2 ;;
esac
[ $# -gt 0 ] && shift
if [ $# -eq 0 ]; then
    set -- n0=IP:127.0.0.1,DNS:localhost n1=IP:127.0.0.1,DNS:localhost \
        n2=IP:127.0.0.1,DNS:localhost namesrv=IP:127.0.0.1,DNS:localhost
fi
for spec in "$@"; do
    case ${spec%%=*} in
        ca | ca-key | *[!A-Za-z0-9._-]*)
            echo "make-certs.sh: ${spec%%=*} cannot name a certificate" >&2; exit 2 ;;
    esac
    case $spec in
        ?*=?*) ;;
        *) echo "make-certs.sh: $spec is not NAME=SANS" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
cd "$out"
# The CA's extensions from a file of their own (not -addext, which older
# openssl releases add beside their default config's, a duplicate webpki
# refuses).
cat > ca.cnf <<'CNF'
[req]
distinguished_name = dn
x509_extensions = ca
prompt = no
[dn]
CN = LedgerMQ development CA
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
CNF
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -config ca.cnf \
    -keyout ca-key.pem -out ca.pem -days 825
made=""
for spec in "$@"; do
    n=${spec%%=*}
    sans=${spec#*=}
    # Node certificates also authenticate their node to its peers (mutual TLS
    # on the Raft port); a name server's only serves.
    usage=serverAuth,clientAuth
    case $n in namesrv*) usage=serverAuth ;; esac
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$n-key.pem" -out "$n.csr" -subj "/CN=$n"
    printf '%s\n' \
        "subjectAltName=$sans" \
        'basicConstraints=critical,CA:FALSE' \
        'keyUsage=critical,digitalSignature' \
        "extendedKeyUsage=$usage" > "$n.ext"
    openssl x509 -req -in "$n.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
        -out "$n.pem" -days 825 -extfile "$n.ext"
    rm -f "$n.csr" "$n.ext"
    made="$made $n.pem"
done
rm -f ca.srl ca.cnf
chmod 600 ./*-key.pem
echo "certificates in $(pwd): ca.pem,$made (keys: *-key.pem)"
