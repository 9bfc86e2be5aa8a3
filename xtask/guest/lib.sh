# Helpers for guest cases (sourced by /case.sh).
T=/sys/kernel/tracing
MM=/sys/kernel/mm/transparent_hugepage

# The oracle's kprobe events. $argN works on x86-64 and arm64 alike.
oracle_setup() {
	echo > $T/kprobe_events
	echo 'p:fso/hmf handle_mm_fault addr=$arg2:x64 flags=$arg3:u32 regs=$arg4:u64' >> $T/kprobe_events
	echo 'r:fso/hmfr handle_mm_fault ret=$retval:u32' >> $T/kprobe_events
	echo 'p:fso/wp do_wp_page' >> $T/kprobe_events
	echo 'p:fso/hwp do_huge_pmd_wp_page' >> $T/kprobe_events
	echo 'p:fso/nar folio_add_new_anon_rmap' >> $T/kprobe_events
	if [ "$(uname -m)" = aarch64 ]; then
		echo 'p:fso/abt do_mem_abort far=$arg1:x64 esr=$arg2:x64' >> $T/kprobe_events
		echo 'p:fso/unfold __contpte_try_unfold' >> $T/kprobe_events
		echo 'p:fso/conv contpte_convert' >> $T/kprobe_events
		echo 'p:fso/fold __contpte_try_fold' >> $T/kprobe_events
	else
		echo 1 > $T/events/exceptions/page_fault_user/enable
	fi
	echo 1 > $T/options/record-tgid
	echo 32768 > $T/buffer_size_kb
	echo 0 > $T/tracing_on
	echo 1 > $T/events/fso/enable
	echo 1 > $T/events/sched/sched_process_exec/enable
}

# thp_mode 4K|64K|2M: the folio size new anonymous memory gets.
thp_mode() {
	for d in $MM/hugepages-*kB; do
		[ -w $d/enabled ] && echo never > $d/enabled
	done
	case $1 in
	4K) echo never > $MM/enabled ;;
	64K) echo never > $MM/enabled; echo always > $MM/hugepages-64kB/enabled ;;
	2M) echo always > $MM/enabled; echo inherit > $MM/hugepages-2048kB/enabled ;;
	esac
}

# up LABEL: seconds since boot, for the guest's own timing.
up() { read u _ < /proc/uptime; echo "@@FS-UP $1 $u"; }

stat64k() { cat $MM/hugepages-64kB/stats/anon_fault_alloc 2>/dev/null || echo 0; }

# emit NAME FILE: a file's content between markers on the console.
emit() {
	echo "@@FS-BEGIN $1"
	cat "$2"; echo
	echo "@@FS-END $1"
}

# run_case NAME FOLIO WORKLOAD-ARGS...: faultscope records the workload while
# the oracle traces; prints reports, oracle counts and kprobe_profile.
run_case() {
	name=$1; folio=$2; shift 2
	thp_mode $folio
	echo > $T/trace
	kp0=$(grep -c . /sys/kernel/debug/kprobes/list)
	a0=$(stat64k)
	echo 1 > $T/tracing_on
	up "$name.start"
	/faultscope record --json /tmp/$name.fs.json -- /faultscope workload --out /tmp/$name.wl.json "$@" > /tmp/$name.out 2>&1
	echo "@@FS-RC $name $?"
	echo 0 > $T/tracing_on
	a1=$(stat64k)
	kp1=$(grep -c . /sys/kernel/debug/kprobes/list)
	echo "@@FS-KPROBES-LEFT $name $((kp1 - kp0))"
	echo "@@FS-MTHP64-ALLOC $name $((a1 - a0))"
	up "$name.recorded"
	/oracle < $T/trace > /tmp/$name.oracle
	up "$name.oracle"
	grep -c . $T/trace | sed "s/^/@@FS-TRACE-LINES $name /"
	grep -h overrun $T/per_cpu/cpu*/stats | awk -v n=$name '{s+=$2} END {print "@@FS-OVERRUN", n, s+0}'
	emit $name.out /tmp/$name.out
	emit $name.fs.json /tmp/$name.fs.json
	emit $name.wl.json /tmp/$name.wl.json
	emit $name.oracle /tmp/$name.oracle
	emit $name.kprobe_profile $T/kprobe_profile
}
