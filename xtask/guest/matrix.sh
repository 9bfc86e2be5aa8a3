# The kernel matrix: faultscope bench cases, each beside the tracefs oracle.
. /lib.sh
oracle_setup

# Every program through this kernel's own verifier, as a run would load
# them, with the instructions each made it process (xtask holds them to
# faultscope's budget). VERIFIER=0 skips it: the gates and the suite's
# later stages boot kernels whose check the matrix has made.
if [ "${VERIFIER:-1}" = 1 ]; then
	/faultscope probes --load > /tmp/verifier.out 2>&1
	echo "@@FS-RC verifier $?"
	emit verifier.out /tmp/verifier.out
fi

# bench_case NAME ARGS...: one bench run while the oracle traces, with
# the probes attached by $BACKEND (NAME is CASE@BACKEND).
bench_case() {
	name=$1; shift
	echo > $T/trace
	echo 1 > $T/tracing_on
	up "$name.start"
	thp_allocs > /tmp/$name.alloc0
	/faultscope bench "$@" --backend $BACKEND --json /tmp/$name.json > /tmp/$name.out 2>&1
	echo "@@FS-RC $name $?"
	thp_allocs > /tmp/$name.alloc1
	echo 0 > $T/tracing_on
	oracle_and_emit $name out json alloc0 alloc1
}

# No THP but the bench's own (bench sets its size's knob): faultscope's
# own memory then gets base pages, and the kernel's per-size allocation
# counts are the bench's.
thp_mode 4K
S=${SIZE:-16M}
case "$CASES" in *hotpatch*) hotpatch_dir $S ;; esac
# $CASES: NAME:BENCH ARGS, separated by ";" (xtask's matrix::CASES).
echo "$CASES" | tr ';' '\n' > /tmp/cases
for BACKEND in ${BACKENDS:-kprobe}; do
	while IFS=: read -r c args; do
		[ -n "$c" ] && bench_case $c@$BACKEND $args --size $S < /dev/null
	done < /tmp/cases
done

# faultscope verify as CI would use it: no contpte unfold in the write phase.
for n in /tmp/64k-exit@*.json /tmp/4k-exit@*.json; do
	[ -f $n ] || continue
	n=${n#/tmp/}; n=${n%.json}
	/faultscope verify --phase mark:write --expect contpte_unfold=0 /tmp/$n.json > /tmp/verify-$n.out 2>&1
	echo "@@FS-VERIFY $n $?"
	emit verify-$n /tmp/verify-$n.out
done

# The whole-folio reuse gate, as CI would run it on a patched kernel: at
# most 1.05 reuse faults per folio in the write step.
if [ "${GATES:-0}" = 1 ]; then
	for c in /tmp/64k-exit@*.json /tmp/2m-pte-exit@*.json; do
		[ -f $c ] || continue
		c=${c#/tmp/}; c=${c%.json}
		/faultscope verify --phase mark:write --expect 'reuse/folio<=1.05' /tmp/$c.json > /tmp/gate-$c.out 2>&1
		echo "@@FS-GATE $c $?"
		emit gate-$c /tmp/gate-$c.out
	done
fi
