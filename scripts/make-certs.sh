#!/usr/bin/env bash
# Makes a private CA and one certificate signed by it, for Shoal's TLS
# (docs/SECURITY.md). Every Shoal process may share the one certificate: it is
# valid for serving and for calling (mutual TLS), for the names given.
#   scripts/make-certs.sh DIR [NAME...]
# NAMEs become the certificate's subjectAltNames: an IP address (127.0.0.1,
# 10.0.0.7) or a DNS name (shoal-coordinator, *.shoal.svc). Default:
# 127.0.0.1 and localhost. Writes DIR/ca.pem, DIR/ca.key (keep it off the
# machines), DIR/shoal.pem and DIR/shoal.key. An existing CA in DIR is reused,
# so running it again with other names makes a new certificate under the same CA.
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR [NAME...]}
shift
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(127.0.0.1 localhost)
mkdir -p "$dir"
umask 077

san=""
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san=${san%,}

if [[ ! -f "$dir/ca.pem" ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 825 -subj "/CN=shoal run CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/shoal.key" -out "$dir/shoal.csr" -subj "/CN=shoal" 2>/dev/null
cat > "$dir/shoal.ext" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EXT
openssl x509 -req -in "$dir/shoal.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAcreateserial -out "$dir/shoal.pem" -days 825 -extfile "$dir/shoal.ext" 2>/dev/null
rm -f "$dir/shoal.csr" "$dir/shoal.ext" "$dir/ca.srl"
chmod 644 "$dir/ca.pem" "$dir/shoal.pem"
echo "make-certs: $dir/ca.pem, $dir/shoal.pem and $dir/shoal.key for $san"
