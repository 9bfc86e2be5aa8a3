# The kernel matrix: faultscope bench cases, each beside the tracefs oracle.
. /lib.sh
oracle_setup

# bench_case NAME ARGS...: one bench run while the oracle traces.
bench_case() {
	name=$1; shift
	echo > $T/trace
	echo 1 > $T/tracing_on
	up "$name.start"
	/faultscope bench "$@" --json /tmp/$name.json > /tmp/$name.out 2>&1
	echo "@@FS-RC $name $?"
	echo 0 > $T/tracing_on
	up "$name.recorded"
	/oracle < $T/trace > /tmp/$name.oracle
	grep -h overrun $T/per_cpu/cpu*/stats | awk -v n=$name '{s+=$2} END {print "@@FS-OVERRUN", n, s+0}'
	emit $name.out /tmp/$name.out
	emit $name.json /tmp/$name.json
	emit $name.oracle /tmp/$name.oracle
}

S=${SIZE:-16M}
for c in $CASES; do
	case $c in
	4k-exit) bench_case $c seq --size $S --folio 4K --child exit ;;
	# With the kernel stacks of unfolds: which kernel path unfolded.
	64k-exit) bench_case $c seq --size $S --folio 64K --child exit --stacks contpte_unfold ;;
	2m-pte-exit) bench_case $c seq --size $S --folio 2M --child exit ;;
	2m-pmd-exit) bench_case $c seq --size $S --folio 2M --pmd --child exit ;;
	4k-alive) bench_case $c seq --size $S --folio 4K --child alive ;;
	64k-alive) bench_case $c seq --size $S --folio 64K --child alive ;;
	spurious-race) bench_case $c threads-same --threads 4 --size $S --folio 4K --child exit ;;
	esac
done

# faultscope verify as CI would use it: no contpte unfold in the write phase.
for c in 64k-exit 4k-exit; do
	[ -f /tmp/$c.json ] || continue
	/faultscope verify --phase mark:write --expect contpte_unfold=0 /tmp/$c.json > /tmp/verify-$c.out 2>&1
	echo "@@FS-VERIFY $c $?"
	emit verify-$c /tmp/verify-$c.out
done

# The whole-folio reuse gate, as CI would run it on a patched kernel: at
# most 1.05 reuse faults per folio in the write step.
if [ "$GATES" = 1 ]; then
	for c in 64k-exit 2m-pte-exit; do
		[ -f /tmp/$c.json ] || continue
		/faultscope verify --phase mark:write --expect 'reuse/folio<=1.05' /tmp/$c.json > /tmp/gate-$c.out 2>&1
		echo "@@FS-GATE $c $?"
		emit gate-$c /tmp/gate-$c.out
	done
fi
