# bench/e2e/lib.sh: what the scripts beside it that start servers on fixed
# ports share. Sourced, not run.

# ports_free NAME PORT...: exits, naming the script NAME, when a UDP socket
# holds one of the PORTs: a server left from another run would share it.
ports_free() {
	local name=$1 p
	shift
	for p in "$@"; do
		if ss -Hlun "sport = :$p" | grep -q .; then
			echo "$name: port $p is in use (a server left from another run?)" >&2
			exit 1
		fi
	done
}
