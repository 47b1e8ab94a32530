# Shell helpers the stack scripts share (deploy/stack.sh,
# deploy/production/kafka.sh, deploy/production/postgres.sh). Sourced, not
# run. The sourcing script sets, before it calls them:
#   stack_name   the prefix of its messages ("stack", "kafka-prod", ...)
#   timeout      seconds wait_for waits
#   pg_os_user   the unprivileged user PostgreSQL runs as (as_pg)

die() { echo "$stack_name: $*" >&2; exit 1; }

# PostgreSQL and PgBouncer refuse to run as root: run their commands as an
# unprivileged user.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$pg_os_user" -- "$@"
  else
    "$@"
  fi
}

# wait_for NAME LOG COMMAND...: retries COMMAND until it succeeds or the
# deadline passes, then fails pointing at LOG.
wait_for() {
  local name=$1 log=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "$stack_name: $name did not answer within ${timeout}s; last lines of $log:" >&2
      tail -n 20 "$log" >&2 || true
      exit 1
    fi
    sleep 0.3
  done
}

# tls_ca DIR CN: a CA (DIR/ca.key, mode 600; DIR/ca.crt) unless DIR has one.
tls_ca() {
  local d=$1 cn=$2
  mkdir -p "$d"
  [ -s "$d/ca.crt" ] && return 0
  (umask 077 && openssl genrsa -out "$d/ca.key" 2048 2>/dev/null)
  openssl req -x509 -new -key "$d/ca.key" -sha256 -days 825 -subj "/CN=$cn" \
    -out "$d/ca.crt" 2>/dev/null
  chmod 644 "$d/ca.crt"
}

# tls_cert DIR NAME CN USAGE: DIR/NAME.key (mode 600) and DIR/NAME.crt, signed
# by DIR's CA, for 127.0.0.1 and localhost; USAGE is the extendedKeyUsage
# (serverAuth, or serverAuth,clientAuth).
tls_cert() {
  local d=$1 name=$2 cn=$3 usage=$4
  (umask 077 && openssl genrsa -out "$d/$name.key" 2048 2>/dev/null)
  openssl req -new -key "$d/$name.key" -subj "/CN=$cn" -out "$d/$name.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\n' "$usage" \
    >"$d/$name.ext"
  openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 825 -sha256 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
  rm -f "$d/$name.csr" "$d/$name.ext"
}
