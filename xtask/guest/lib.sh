# Helpers for guest cases (sourced by /case.sh).
# An unset variable is an error (a misspelt name must not read as empty):
# optional inputs are read as ${NAME:-default}.
set -u
# Extra arguments of faultscope record (redis.sh, daemon.sh; none by default).
RECORD_ARGS=${RECORD_ARGS:-}
T=/sys/kernel/tracing
MM=/sys/kernel/mm/transparent_hugepage

# oracle_event NAME DEFINITION: adds a kprobe event (fso/NAME; exc: fso/abt).
# If the kernel refuses it, the oracle cannot count what needs NAME (rather
# than counting 0: oracle.c finds no such event in tracefs and prints
# "class=?"), and "@@FS-ORACLE-MISSING NAME reason" tells the host why.
# Further DEFINITIONs are fallbacks (the same event on another symbol).
oracle_event() {
	name=$1; shift
	for def in "$@"; do
		echo "$def" >> $T/kprobe_events 2>/dev/null && return 0
	done
	sym=${def#* }; sym=${sym%% *}
	why=$(grep 'error:' $T/error_log 2>/dev/null | tail -n 1 | sed 's/^.*error: //')
	grep -qw "$sym" /sys/kernel/debug/kprobes/blacklist && why="$why; $sym is on the kprobe blacklist"
	oracle_missing $name kprobe $sym refused: ${why:-no reason given}
	return 1
}

# oracle_missing EVENT WHY...: the oracle lacks EVENT, said on the console
# and in $ORACLE_REFUSED (for the host tests' oracle, a line each).
ORACLE_REFUSED=/tmp/oracle-refused
oracle_missing() {
	echo "@@FS-ORACLE-MISSING $*"
	echo "$*" >> $ORACLE_REFUSED
}

# The oracle's kprobe events. $argN works on x86-64 and arm64 alike.
oracle_setup() {
	echo > $T/kprobe_events
	oracle_event hmf 'p:fso/hmf handle_mm_fault addr=$arg2:x64 flags=$arg3:u32 regs=$arg4:u64'
	oracle_event hmfr 'r:fso/hmfr handle_mm_fault ret=$retval:u32'
	oracle_event wp 'p:fso/wp do_wp_page'
	oracle_event hwp 'p:fso/hwp do_huge_pmd_wp_page'
	oracle_event shp 'p:fso/shp __split_huge_pmd'
	# The exec THP COW series' own function: only where it is built in.
	if grep -qw do_huge_pmd_exec_cow /proc/kallsyms; then
		oracle_event hec 'p:fso/hec do_huge_pmd_exec_cow'
	fi
	# Before 6.3: page_add_new_anon_rmap (faultscope's table has both).
	oracle_event nar 'p:fso/nar folio_add_new_anon_rmap' 'p:fso/nar page_add_new_anon_rmap'
	oracle_event dsp 'p:fso/dsp fault_dirty_shared_page'
	oracle_event hacc 'p:fso/hacc huge_pmd_set_accessed'
	if [ "$(uname -m)" = aarch64 ]; then
		oracle_event exc 'p:fso/abt do_mem_abort far=$arg1:x64 esr=$arg2:x64'
		# Before contpte (6.9) arm64's own is ptep_set_access_flags.
		oracle_event acc 'p:fso/acc __ptep_set_access_flags' 'p:fso/acc __ptep_set_access_flags_anysz' \
			'p:fso/acc ptep_set_access_flags'
		oracle_event accc 'p:fso/accc contpte_ptep_set_access_flags'
		oracle_event unfold 'p:fso/unfold __contpte_try_unfold'
		oracle_event conv 'p:fso/conv contpte_convert pte=$arg4:x64'
		oracle_event fold 'p:fso/fold __contpte_try_fold'
	else
		oracle_event acc 'p:fso/acc ptep_set_access_flags'
		echo 1 > $T/events/exceptions/page_fault_user/enable ||
			oracle_missing exc tracepoint exceptions:page_fault_user refused
		# The kernel-mode faults' error code (a copy_to_user on a user page).
		echo 1 > $T/events/exceptions/page_fault_kernel/enable ||
			oracle_missing exc tracepoint exceptions:page_fault_kernel refused
		for e in unfold conv fold accc; do oracle_missing $e contpte is arm64 only; done
	fi
	echo 1 > $T/options/record-tgid
	echo ${TRACE_KB:-32768} > $T/buffer_size_kb
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

# host_tests: the host tests (tracer/tests/host, the same binary as on the
# build host, static) run here one at a time against the oracle
# (oracle_setup first): $HOST_TESTS, once for each BACKEND:TIER of
# $HOST_TEST_RUNS, which every record and bench of the tests then use, and
# $HOST_TESTS_ONCE in the first run only;
# libtest's own output as the section host-tests@BACKEND.out, each test's
# time included (--report-time, which RUSTC_BOOTSTRAP lets a stable libtest
# take). Reports the tests keep ($FAULTSCOPE_REPORTS) follow, a section
# each.
host_tests() {
	thp_mode 4K
	mkdir -p /run
	once=${HOST_TESTS_ONCE:-}
	for r in $HOST_TEST_RUNS; do
		b=${r%%:*}
		FAULTSCOPE_BIN=/faultscope FAULTSCOPE_SHIPPED=1 FAULTSCOPE_ORACLE=/oracle FAULTSCOPE_ORACLE_REFUSED=$ORACLE_REFUSED \
			FAULTSCOPE_BACKEND=$b FAULTSCOPE_LATENCY=${r#*:} FAULTSCOPE_ANON_VMA_NAME=${ANON_VMA_NAME:-} \
			FAULTSCOPE_TEST_REPEAT=3 FAULTSCOPE_TEST_INTERVAL=0.1 RUSTC_BOOTSTRAP=1 \
			/host-tests -Z unstable-options --report-time --exact --test-threads=1 --show-output \
			$HOST_TESTS $once > /tmp/host-tests.out 2>&1
		emit host-tests@$b.out /tmp/host-tests.out
		once=
	done
	for f in ${FAULTSCOPE_REPORTS:-/nonexistent}/*.json; do
		if [ -f "$f" ]; then emit ${f##*/} $f; fi
	done
}

# up LABEL: seconds since boot, for the guest's own timing.
up() { read u _ < /proc/uptime; echo "@@FS-UP $1 $u"; }

stat64k() { cat $MM/hugepages-64kB/stats/anon_fault_alloc 2>/dev/null || echo 0; }

# fail WHAT: the case failed; the rest of the script does not run.
fail() { echo "@@FS-FAIL $*"; exit 1; }

# wait_until SECONDS CMD...: runs CMD every 0.1 s until it succeeds; returns
# 1 once SECONDS have passed (the caller says what did not happen).
wait_until() {
	_left=$(($1 * 10)); shift
	until "$@"; do
		[ $_left -le 0 ] && return 1
		_left=$((_left - 1))
		sleep 0.1
	done
}

# recorder_up PID: the record of PID listens on its mark socket (it has
# attached), or it is gone.
recorder_up() { [ -S /run/faultscope/record-$1.sock ] || ! kill -0 $1 2>/dev/null; }

# gone PID: no process PID.
gone() { ! kill -0 $1 2>/dev/null; }

# attached PID: the record of PID has attached (not merely exited).
attached() { [ -S /run/faultscope/record-$1.sock ]; }

# emit NAME FILE: a file's content between markers on the console.
emit() {
	echo "@@FS-BEGIN $1"
	cat "$2"; echo
	echo "@@FS-END $1"
}

# oracle_and_emit NAME SUFFIX...: after a case, the oracle over the trace
# (split by /tmp/NAME.ranges when the case wrote them), the trace's size
# and overrun, and the case's outputs /tmp/NAME.SUFFIX and the oracle's as
# sections. The one tail of every traced case.
oracle_and_emit() {
	name=$1; shift
	up "$name.recorded"
	/oracle $(cat /tmp/$name.ranges 2>/dev/null) < $T/trace > /tmp/$name.oracle
	up "$name.oracle"
	grep -h overrun $T/per_cpu/cpu*/stats | awk -v n=$name '{s+=$2} END {print "@@FS-OVERRUN", n, s+0}'
	for s in "$@"; do
		emit $name.$s /tmp/$name.$s
	done
	emit $name.oracle /tmp/$name.oracle
}

# hotpatch_dir: /mnt/hotpatch, for bench's hotpatch modes: ext4 (large
# folios) on a loop device where the kernel has loop and ext4 built in
# (the kernels built here: the exec THP COW series copies no shmem THP
# whole), else tmpfs mounted huge=always (Debian's kernels have loop as a
# module).
# $1: the bench's --size (NM), which the file system holds with room.
hotpatch_dir() {
	mb=${1%M}
	case "$mb" in '' | *[!0-9]*) mb=256 ;; esac
	fs_mb=$((mb + mb / 2 + 32))
	mkdir -p /mnt/hotpatch
	truncate -s ${fs_mb}M /tmp/hotpatch.img
	if ! { l=$(losetup -f 2>/dev/null) && losetup $l /tmp/hotpatch.img 2>/dev/null &&
		mke2fs -q $l > /dev/null 2>&1 && mount -t ext4 $l /mnt/hotpatch 2>/dev/null; }; then
		rm -f /tmp/hotpatch.img
		mount -t tmpfs -o huge=always,size=${fs_mb}M hotpatch /mnt/hotpatch
	fi
	export FAULTSCOPE_HOTPATCH_DIR=/mnt/hotpatch
}
