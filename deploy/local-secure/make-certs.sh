#!/bin/sh
# A development certificate authority and one certificate per node for
# deploy/local-secure (TLS on the client ports, mutual TLS on the Raft ports,
# TLS on the name server), made with openssl:
#
#   deploy/local-secure/make-certs.sh [OUT_DIR]    # default: deploy/local-secure/certs
#
# OUT_DIR gets ca.pem (the CA certificate clients and members trust),
# ca-key.pem (keep it, or delete it once the node certificates are made),
# n0.pem/n0-key.pem .. n2.pem/n2-key.pem for the broker nodes and
# namesrv.pem/namesrv-key.pem for the name server: P-256 keys, certificates valid
# for 825 days naming 127.0.0.1 and localhost (subjectAltName), for server and
# client authentication (the name server's for server authentication only, so
# it cannot pass for a member on the Raft ports). For real hosts, list each
# host's names and addresses in SAN instead, and keep the CA key off the
# brokers.
set -eu
out=${1:-$(dirname "$0")/certs}
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
for n in n0 n1 n2 namesrv; do
    # Node certificates also authenticate their node to its peers (mutual TLS
    # on the Raft port); the name server's only serves.
    usage=serverAuth,clientAuth
    [ "$n" = namesrv ] && usage=serverAuth
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$n-key.pem" -out "$n.csr" -subj "/CN=$n.broker-s"
    printf '%s\n' \
        'subjectAltName=IP:127.0.0.1,DNS:localhost' \
        'basicConstraints=critical,CA:FALSE' \
        'keyUsage=critical,digitalSignature' \
        "extendedKeyUsage=$usage" > "$n.ext"
    openssl x509 -req -in "$n.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
        -out "$n.pem" -days 825 -extfile "$n.ext"
    rm -f "$n.csr" "$n.ext"
done
rm -f ca.srl ca.cnf
chmod 600 ./*-key.pem
echo "certificates in $(pwd): ca.pem, n0.pem .. n2.pem, namesrv.pem (keys: *-key.pem)"
