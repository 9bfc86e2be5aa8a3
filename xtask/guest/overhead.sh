# The overhead benchmark (`cargo xtask overhead`): the same `faultscope
# bench` (its own step timing) bare, under bpftrace and under faultscope,
# the variants interleaved round after round in one boot, so that every
# ratio is taken under the same conditions. Then, with the kernel's BPF
# run time accounting on, STATS_RUNS more runs of each tracer, whose
# programs bpftool reads right before the bench's write step and at its
# end, while they are attached; then faultscope `record
# --interval 1` over two storms of faults, its CPU time and RSS sampled.
#
# It runs in a guest (its /case.sh) and, with --host, on this machine as
# it is (paths from the environment, no chroot).
#
# Env: BENCH (bench arguments), RUNS, STATS_RUNS, STORM (seconds, 0: none),
# STORM_SIZE, and VARIANTS, one line per variant: NAME KIND ARGS, KIND one
# of none (bench --no-trace), bpftrace (ARGS: a script in $SCRIPTS, run
# beside bench --no-trace), faultscope (ARGS: flags of the traced bench) or
# untraced (bench --no-trace while faultscope record, ARGS its flags,
# traces a sleeper: what faultscope costs the processes it does not trace).
# On the host also FAULTSCOPE, LINETIME, LIB, SCRIPTS, WORK, and BT_ROOT
# empty (the guest chroots into the bpftrace image at /bt).
. ${LIB:-/lib.sh}
FS=${FAULTSCOPE:-/faultscope}
WL=${FS_WORKLOAD:-/fs-workload}
LT=${LINETIME:-/linetime}
W=${WORK:-/tmp}
BT=${BT_ROOT-/bt}
SCRIPTS=${SCRIPTS:-/bt-scripts}


# $BTX CMD...: bpftrace and bpftool run inside the bpftrace image's root
# in a guest, as they are on the host.
BTX=${BT:+chroot $BT}
in_bt() { $BTX "$@"; }

# The bpftrace image (an NVMe disk) mounted, with the guest's file systems
# inside, for chroot; the scripts copied in.
bt_mount() {
	wait_until 30 [ -b /dev/nvme0n1 ] || fail "no /dev/nvme0n1 (the bpftrace image) after 30 s"
	mkdir -p $BT
	mount -t ext4 -o ro /dev/nvme0n1 $BT || fail "mount the bpftrace image"
	mount -t proc proc $BT/proc && mount -t sysfs sys $BT/sys && mount -t devtmpfs dev $BT/dev &&
		mount -t tmpfs tmp $BT/tmp || fail "file systems in the bpftrace root"
	mount -t tracefs nodev $BT/sys/kernel/tracing
	mount -t debugfs nodev $BT/sys/kernel/debug
	cp $SCRIPTS/* $BT/tmp/
	SCRIPTS=/tmp
}

# wait_file FILE PID: until FILE is there; fails when PID is gone first.
wait_file() {
	wait_until 300 written_or_gone "$1" $2 && [ -s "$1" ]
}

# written_or_gone FILE PID: FILE has content, or PID is gone.
written_or_gone() { [ -s "$1" ] || ! kill -0 $2 2>/dev/null; }

# stuck WHAT PID...: what everything is doing (ps, the processes' kernel
# stacks, dmesg), then fail: a run that hangs says where.
stuck() {
	what=$1; shift
	echo "@@FS-BEGIN stuck"
	ps
	for p in "$@"; do
		for t in /proc/$p/task/*; do
			echo "== $t: $(cut -d' ' -f1-3 $t/stat 2>/dev/null) wchan $(cat $t/wchan 2>/dev/null)"
			cat $t/stack 2>/dev/null
		done
	done
	dmesg | tail -n 60
	echo "@@FS-END stuck"
	fail "$what"
}

# finish PID SECS WHAT: waits for PID (a child of this shell) and returns its
# exit status; if it runs longer than SECS, stuck.
finish() {
	wait_until $2 gone $1 || stuck "$3: still running after $2 s" $1 $(cat /proc/$1/task/*/children 2>/dev/null)
	wait $1
}

# bench CASE [FLAGS]: the timed workload; its report is CASE.json.
bench() {
	c=$1; shift
	$FS bench $BENCH "$@" --json $W/$c.json > $W/$c.bench 2>&1 &
	finish $! 900 "$c: the bench"
}

# bench_stopped CASE ARGS...: bench, which stops itself right before its
# write step (a hidden bench flag) for write_step_starts.
bench_stopped() {
	c=$1; shift
	$FS bench $BENCH "$@" --stop-before-write --json $W/$c.json > $W/$c.bench 2>&1 &
	b=$!
	write_step_starts $c $b
	finish $b 900 "$c: the bench"
}

# write_step_starts CASE PID: once the bench PID has stopped before its
# write step, bpftool reads every program (CASE.before.progs), and the
# bench goes on: the stats rounds' programs over the write step alone.
write_step_starts() {
	wait_until 600 stopped_or_gone $2 && stopped $2 ||
		fail "$1: the bench did not stop before its write step: $(cat $W/$1.bench 2>/dev/null)"
	in_bt /usr/sbin/bpftool -j prog show > $W/$1.before.progs 2>&1
	emit $1.before.progs $W/$1.before.progs
	kill -CONT $2
}

# stopped PID: the process is stopped (its state in /proc/PID/stat).
stopped() { [ "$(awk '{print $3}' /proc/$1/stat 2>/dev/null)" = T ]; }
stopped_or_gone() { stopped $1 || ! kill -0 $1 2>/dev/null; }

# bt_start CASE SCRIPT: bpftrace attached; @@FS-ATTACH CASE NS (start to
# the BEGIN line, printed once every probe is attached).
bt_start() {
	$LT $W/$1.attach 'bpftrace: attached' $BTX /usr/bin/bpftrace -B line $SCRIPTS/$2 > $W/$1.bt &
	bt=$!
	if ! wait_file $W/$1.attach $bt; then
		emit $1.bt $W/$1.bt
		fail "$1: bpftrace did not attach"
	fi
	echo "@@FS-ATTACH $1 $(cat $W/$1.attach)"
}

# bt_stop CASE: SIGINT to bpftrace (it prints its maps and exits), again
# every 2 s until it has: bpftrace 0.17 sometimes sleeps on in epoll_wait
# after the first (seen under TCG), a lost wakeup that a second one ends.
bt_stop() {
	p=$(cat $W/$1.attach.pid)
	i=0
	while kill -0 $p 2>/dev/null; do
		[ $((i % 20)) = 0 ] && kill -INT $p
		i=$((i + 1))
		[ $i -gt 3000 ] && stuck "$1: bpftrace still running 300 s after SIGINT" $p
		sleep 0.1
	done
	[ $i -gt 20 ] && echo "@@FS-BPFTRACE-SIGINTS $1 $((i / 20 + 1))"
	finish $bt 60 "$1: linetime after bpftrace's exit"
	echo "@@FS-TRACER-RC $1 $?"
	emit $1.bt $W/$1.bt
}

# untraced_start CASE FLAGS...: a sleeper, and faultscope record -p of it
# with FLAGS, attached (its "measuring" line): @@FS-ATTACH CASE NS.
untraced_start() {
	uc=$1; shift
	sleep 100000 &
	sl=$!
	$LT $W/$uc.attach 'faultscope: measuring' $FS record -p $sl "$@" \
		--json $W/$uc.record.json > $W/$uc.out 2>&1 &
	fs=$!
	wait_file $W/$uc.attach $fs || { emit $uc.out $W/$uc.out; fail "$uc: faultscope did not attach"; }
	echo "@@FS-ATTACH $uc $(cat $W/$uc.attach)"
}

# untraced_stop CASE: SIGINT to faultscope record (it detaches, reports and
# exits 0), then the sleeper ended: @@FS-TRACER-RC CASE RC; fails unless 0.
untraced_stop() {
	kill -INT $(cat $W/$1.attach.pid)
	finish $fs 300 "$1: faultscope record after SIGINT"
	frc=$?
	echo "@@FS-TRACER-RC $1 $frc"
	kill $sl
	wait $sl
	[ $frc = 0 ] || { emit $1.out $W/$1.out; fail "$1: faultscope record exited with $frc"; }
	emit $1.record.json $W/$1.record.json
}

# run NAME KIND ARGS...: one timed run of a variant.
run() {
	c=$1 kind=$2; shift 2
	case $kind in
	none)
		bench $c --no-trace
		;;
	bpftrace)
		bt_start $c $1
		bench $c --no-trace
		rc=$?
		bt_stop $c
		(exit $rc)
		;;
	faultscope)
		$LT $W/$c.attach 'faultscope: measuring' $FS bench $BENCH "$@" --json $W/$c.json > $W/$c.bench 2>&1 &
		finish $! 900 "$c: the traced bench"
		;;
	untraced)
		untraced_start $c "$@"
		bench $c --no-trace
		rc=$?
		untraced_stop $c
		(exit $rc)
		;;
	esac
	rc=$?
	echo "@@FS-RC $c $rc"
	[ -s $W/$c.attach ] && [ $kind = faultscope ] && echo "@@FS-ATTACH $c $(cat $W/$c.attach)"
	[ $rc = 0 ] || emit $c.bench $W/$c.bench
	emit $c.json $W/$c.json
}

# progs CASE: the BPF programs loaded now, as bpftool sees them (run time
# and run count while kernel.bpf_stats_enabled is 1), and the ids of those
# the tracer holds (its fds' fdinfo): @@FS-PROG-IDS CASE ID...
progs() {
	in_bt /usr/sbin/bpftool -j prog show > $W/$1.progs 2>&1
	pid=$(cat $W/$1.attach.pid)
	echo "@@FS-PROG-IDS $1 $(cat /proc/$pid/fdinfo/* 2>/dev/null | awk '$1 == "prog_id:" {print $2}' | sort -un | tr '\n' ' ')"
	emit $1.progs $W/$1.progs
}

# stats NAME KIND ARGS...: the tracer attached over one bench run with the
# kernel's run time accounting on; bpftool reads its programs before it
# detaches. faultscope traces a shell that runs the bench as its child and
# stays (record --follow-children), so that it is still attached after.
stats() {
	c=$1 kind=$2; shift 2
	case $kind in
	bpftrace)
		bt_start $c $1
		bench_stopped $c --no-trace
		progs $c
		bt_stop $c
		;;
	faultscope)
		sh -c "until [ -e $W/$c.go ]; do sleep 0.05; done
			$FS bench $BENCH --no-trace --stop-before-write --json $W/$c.json > $W/$c.bench 2>&1 &
			echo \$! > $W/$c.bench.pid; wait \$!
			echo \$? > $W/$c.done; exec sleep 100000" &
		sh=$!
		$LT $W/$c.attach 'faultscope: measuring' $FS record -p $sh --follow-children "$@" \
			--json $W/$c.record.json > $W/$c.out 2>&1 &
		fs=$!
		wait_file $W/$c.attach $fs || { emit $c.out $W/$c.out; fail "$c: faultscope did not attach"; }
		touch $W/$c.go
		wait_until 600 [ -s $W/$c.bench.pid ] || fail "$c: the bench did not start"
		write_step_starts $c $(cat $W/$c.bench.pid)
		wait_until 600 [ -s $W/$c.done ] || fail "$c: the bench did not end"
		echo "@@FS-RC $c $(cat $W/$c.done)"
		progs $c
		kill $sh
		finish $fs 300 "$c: faultscope record after its target's exit"
		echo "@@FS-TRACER-RC $c $?"
		emit $c.json $W/$c.json
		;;
	untraced)
		untraced_start $c "$@"
		bench_stopped $c --no-trace
		echo "@@FS-RC $c $?"
		progs $c
		untraced_stop $c
		;;
	esac
}

# storm NAME BY ARGS...: faultscope record --interval 1 --duration STORM
# attached to a storm of faults already under way: rounds of a fork (BY
# fork: the child exits, each write a COW reuse, each round two phases) or
# of MADV_DONTNEED (BY dontneed: each write a first touch), each followed
# by a write of every 4K page. Its CPU time (utime, stime: clock ticks) and
# RSS, peak RSS (kB) sampled every second from its attach to its end:
# @@FS-STORM-SAMPLE NAME UPTIME UTIME STIME RSS_KB HWM_KB. The report
# follows.
storm() {
	c=$1 by=$2; shift 2
	$WL --size $STORM_SIZE --repeat-for $((STORM * 3 + 300)) --repeat-by $by < /dev/null > /dev/null 2>&1 &
	wl=$!
	$LT $W/$c.attach 'faultscope: measuring' $FS record -p $wl --interval 1 --duration $STORM \
		"$@" --json $W/$c.json > $W/$c.out 2>&1 &
	fs=$!
	wait_file $W/$c.attach $fs || { emit $c.out $W/$c.out; fail "$c: faultscope did not attach"; }
	echo "@@FS-ATTACH $c $(cat $W/$c.attach)"
	pid=$(cat $W/$c.attach.pid)
	while kill -0 $pid 2>/dev/null; do
		read u _ < /proc/uptime
		set -- $(cat /proc/$pid/stat 2>/dev/null)
		ut=${14:-} st=${15:-}
		mem=$(awk '$1 == "VmRSS:" {r = $2} $1 == "VmHWM:" {h = $2} END {if (h) print r, h}' /proc/$pid/status 2>/dev/null)
		[ -n "$ut" ] && [ -n "$mem" ] && echo "@@FS-STORM-SAMPLE $c $u $ut $st $mem"
		sleep 1
	done
	finish $fs 300 "$c: faultscope record after --duration"
	echo "@@FS-RC $c $?"
	kill -KILL $wl
	wait $wl
	emit $c.json $W/$c.json
}

# each FUNC SUFFIX [KIND]: FUNC NAME$SUFFIX KIND ARGS... for each variant
# (of KIND only, if given; "tracer": every kind but none).
each() {
	f=$1 sfx=$2 only=${3:-}
	for n in $(echo "$VARIANTS" | awk 'NF {print $1}'); do
		set -- $(echo "$VARIANTS" | awk -v n=$n '$1 == n')
		name=$1 kind=$2
		shift 2
		case "$only" in
		"") ;;
		tracer) [ $kind = none ] && continue ;;
		*) [ $kind = "$only" ] || continue ;;
		esac
		$f $name$sfx $kind "$@"
	done
}

up boot
if [ -n "$BT" ]; then bt_mount; fi
# bpftrace finds tracepoints in tracefs, which a fresh host may not have
# mounted (faultscope mounts it itself).
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing || fail "mount tracefs"
echo "@@FS-BPFTRACE-VERSION $(in_bt /usr/bin/bpftrace --version)"
stats0=$(cat /proc/sys/kernel/bpf_stats_enabled)
trap 'echo $stats0 > /proc/sys/kernel/bpf_stats_enabled' EXIT
echo 0 > /proc/sys/kernel/bpf_stats_enabled
# The first run in a fresh guest pays for the memory's first use: one
# untimed bare run first.
bench warmup --no-trace
for round in $(seq $RUNS); do
	each run $round
	up round$round
done
echo 1 > /proc/sys/kernel/bpf_stats_enabled
for round in $(seq ${STATS_RUNS:-3}); do
	each stats -stats$round tracer
done
echo $stats0 > /proc/sys/kernel/bpf_stats_enabled
up stats
# The storms with the first faultscope variant: its user space, which they
# measure, is the same whatever the backend.
if [ "${STORM:-0}" != 0 ]; then
	set -- $(echo "$VARIANTS" | awk '$2 == "faultscope" {print; exit}')
	if [ -n "$1" ]; then
		name=$1; shift 2
		for by in fork dontneed; do storm $name-storm-$by $by "$@"; done
	fi
fi
up done
