#!/usr/bin/env bash
# Generate authentication material for a local duet cluster (docs/security.md
# "Authentication") with the openssl CLI:
#
#   scripts/gen-auth.sh DIR [NAME ...]
#
#   DIR/ca.pem, ca.key     a cluster CA (EC P-256, 30 days)
#   DIR/node.pem, node.key a certificate for every process of the cluster,
#                          server and client use, naming localhost,
#                          127.0.0.1, ::1, "duet-node" and each extra NAME
#                          (DNS names, or IP addresses)
#   DIR/secret             a random shared secret (64 hex digits)
#   DIR/ROLE-NAME.pem, .key for each argument ROLE/NAME (ROLE router, prefill,
#                          decode or client): a certificate with the same
#                          names plus the identity URI spiffe://duet/ROLE/NAME
#                          (docs/security.md "Identities and roles"), one per
#                          process; node.pem names no identity, so peers
#                          refuse it the methods that need a role
#
# DIR is created 0700 if missing; every file is 0600.  Certificates for a
# real deployment come from your PKI (cert-manager on Kubernetes: see
# docs/security.md), not from this script.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME ...]" >&2
  exit 2
fi
if ! command -v openssl >/dev/null 2>&1; then
  echo "gen-auth: the openssl command is missing (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
dir=$1
shift
umask 077
mkdir -p "$dir"
chmod 700 "$dir"

san="DNS:localhost,IP:127.0.0.1,IP:::1,DNS:duet-node"
ids=()
for n in "$@"; do
  if [[ $n == */* ]]; then
    if ! [[ $n =~ ^(router|prefill|decode|client)/[A-Za-z0-9._-]{1,63}$ ]]; then
      echo "gen-auth: $n: want ROLE/NAME, ROLE router|prefill|decode|client" >&2
      exit 2
    fi
    ids+=("$n")
  elif [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then
    san="$san,IP:$n"
  else
    san="$san,DNS:$n"
  fi
done

ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 30 \
  -subj "/CN=duet cluster CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req "${ec[@]}" -keyout "$dir/node.key" -out "$dir/node.csr" \
  -subj "/CN=duet-node" 2>/dev/null
printf '%s\n' "subjectAltName=$san" "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth,clientAuth" \
  >"$dir/node.ext"
openssl x509 -req -in "$dir/node.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAcreateserial -out "$dir/node.pem" -days 30 -extfile "$dir/node.ext" 2>/dev/null
for id in "${ids[@]}"; do
  f="$dir/${id%%/*}-${id#*/}"
  openssl req "${ec[@]}" -keyout "$f.key" -out "$f.csr" -subj "/CN=${id#*/}" 2>/dev/null
  printf '%s\n' "subjectAltName=$san,URI:spiffe://duet/$id" "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth,clientAuth" >"$f.ext"
  openssl x509 -req -in "$f.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$f.pem" -days 30 -extfile "$f.ext" 2>/dev/null
  rm -f "$f.csr" "$f.ext"
done
rm -f "$dir/node.csr" "$dir/node.ext" "$dir/ca.srl"
openssl rand -hex 32 >"$dir/secret"
chmod 600 "$dir"/*
