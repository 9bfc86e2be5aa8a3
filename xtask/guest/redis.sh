# Redis end to end (`cargo xtask redis`): the host's own redis-server, seen
# over virtio-9p and run in a chroot, traced by faultscope across a BGSAVE
# while the tracefs oracle traces the same run.
#
# Tracing control, faultscope (/faultscope, static, from the
# initramfs) and the oracle stay outside the chroot; only Redis and its
# tools run inside it. PIDs are global, so faultscope -p works across.
#
# Env: MODULES (kernel modules in load order, /modules/NAME.ko; none where
# the kernel has 9p built in), KEYS, VALUE_SIZE, REQUESTS (MTHP_REQUESTS for
# mthp), RUNS (of run1, run2, mthp; default run1 run2); RECORD_ARGS (more
# options for faultscope record). With REDIS_FUNCTIONS_ONLY set, it only
# defines its functions (daemon.sh sources it).
. /lib.sh
H=/host
SOCK=/tmp/redis.sock # inside the chroot; $H$SOCK outside


# The host's / over 9p, with the guest's /proc, /sys and /dev, and tmpfs
# where Redis and its tools write.
host_root() {
	for m in ${MODULES:-}; do
		insmod /modules/$m.ko || fail "insmod $m"
	done
	mkdir -p $H
	# The export is read-only, so caching it (cache=loose) is safe; it makes
	# every exec of a dynamic binary a lot cheaper under TCG.
	mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose hostroot $H || fail "mount -t 9p hostroot"
	for d in proc sys dev; do
		mount -o bind /$d $H/$d || fail "bind /$d"
	done
	mount -t tmpfs tmp $H/tmp && mount -t tmpfs run $H/run || fail "tmpfs in the chroot"
}

in_host() { chroot $H /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp "$@"; }
cli() { in_host /usr/bin/redis-cli -s $SOCK "$@" | tr -d '\r'; }
info_field() { cli INFO "$1" | sed -n "s/^$2://p"; }
uptime_s() { read u _ < /proc/uptime; echo $u; }
redis_up() { [ "$(cli PING 2>/dev/null)" = PONG ]; }
bgsave_done() { [ "$(info_field persistence rdb_bgsave_in_progress)" = 0 ]; }

# The data set, loaded inside Redis in one script (as fast as DEBUG
# POPULATE), under the names redis-benchmark -r gives its keys
# (key:%012d, 0 <= n < KEYS), so that the SETs overwrite them.
LOAD="local v = string.rep('x', tonumber(ARGV[2]))
for i = 0, tonumber(ARGV[1]) - 1 do redis.call('SET', string.format('key:%012d', i), v) end
return 'loaded'"

# start_redis RUN: a fresh trace, then redis-server exec'd while tracing is
# on (the oracle counts a process from its exec), then the data set.
start_redis() {
	dir=/tmp/$1
	mkdir -p $H$dir
	echo > $T/trace
	echo 1 > $T/tracing_on
	in_host /usr/bin/redis-server --port 0 --unixsocket $SOCK --save '' --appendonly no \
		--dir $dir --logfile $dir/redis.log ${REDIS_ARGS:-} &
	wait_until 30 redis_up || { emit $1.redis.log $H$dir/redis.log; fail "$1: redis-server did not start"; }
	pid=$(pidof redis-server)
	echo "@@FS-PID $1 $pid"
	echo "@@FS-KEYS $1 $KEYS"
	up "$1.redis-up"
	echo "@@FS-POPULATE $1 $(cli EVAL "$LOAD" 0 $KEYS $VALUE_SIZE) dbsize=$(cli DBSIZE)"
	up "$1.populated"
}

# bgsave RUN [THEN]: BGSAVE, then the function THEN (given RUN) once it
# answers, then wait until Redis has reaped the child
# (rdb_bgsave_in_progress:0). @@FS-BGSAVE RUN T0 T1 REPLY: /proc/uptime
# before the command and when the end was seen.
bgsave() {
	t0=$(uptime_s)
	r=$(cli BGSAVE)
	[ -z "${2:-}" ] || $2 $1
	wait_until 60 bgsave_done || fail "$1: BGSAVE did not end"
	t1=$(uptime_s)
	echo "@@FS-BGSAVE $1 $t0 $t1 $r"
}

# info RUN WHEN: the whole INFO as section RUN.info.WHEN.
info() {
	cli INFO > /tmp/$1.info.$2
	emit $1.info.$2 /tmp/$1.info.$2
}

# record_start RUN: faultscope record -p on redis-server; returns once it
# listens for marks, which it does after writing "faultscope phase attach".
record_start() {
	kp0=$(grep -c . /sys/kernel/debug/kprobes/list)
	/faultscope record -p $pid --json /tmp/$1.fs.json $RECORD_ARGS > /tmp/$1.out 2>&1 &
	fs=$!
	if ! wait_until 120 recorder_up $fs || ! attached $fs; then
		emit $1.out /tmp/$1.out
		if kill -0 $fs 2>/dev/null; then
			for f in status wchan stack syscall; do emit $1.faultscope.$f /proc/$fs/$f; done
			for t in /proc/$fs/task/*; do echo "task $t: $(cat $t/wchan) $(cat $t/syscall)"; done
			dmesg | tail -n 20
		fi
		fail "$1: faultscope did not attach within 120 s"
	fi
	up "$1.attached"
	# Redis is idle here; let any straggling work (the last client's
	# teardown) finish inside the window.
	sleep 0.3
}

# bench RUN [N]: redis-benchmark SETs (N, default REQUESTS) over the
# populated key range.
bench() {
	in_host /usr/bin/redis-benchmark -s $SOCK -t set -n ${2:-$REQUESTS} -d $VALUE_SIZE -r $KEYS -q 2>&1 |
		tr '\r' '\n' | grep . | tail -n 1 > /tmp/$1.bench
	echo "@@FS-BENCH $1 $(cat /tmp/$1.bench)"
	up "$1.bench"
}

# record_stop RUN: SIGINT to faultscope (Redis idle by then), tracing off,
# the oracle over the trace, everything printed.
record_stop() {
	sleep 0.3
	kill -INT $fs
	wait $fs
	echo "@@FS-RC $1 $?"
	echo 0 > $T/tracing_on
	kp1=$(grep -c . /sys/kernel/debug/kprobes/list)
	echo "@@FS-KPROBES-LEFT $1 $((kp1 - kp0))"
	oracle_and_emit $1 out fs.json
}

stop_redis() {
	cli SHUTDOWN NOSAVE > /dev/null 2>&1
	wait_until 10 gone $pid || kill -9 $pid
	emit $1.redis.log $H/tmp/$1/redis.log
}

[ -n "${REDIS_FUNCTIONS_ONLY:-}" ] && return 0

up boot
host_root
up host-root
echo "@@FS-REDIS-VERSION $(in_host /usr/bin/redis-server --version)"
# What Redis asks of a host that BGSAVEs (it warns otherwise).
echo 1 > /proc/sys/vm/overcommit_memory
oracle_setup
# Redis turns THP off for itself (disable-thp yes); 4K for everything else
# traced beside it too.
thp_mode 4K

for r in ${RUNS:-run1 run2}; do
	case $r in
	# Run 1: BGSAVE first (the child has exited when faultscope attaches),
	# then SETs: the pages the fork write-protected are reused, one by one.
	run1)
		start_redis run1
		bgsave run1
		info run1 after-bgsave
		record_start run1
		bench run1
		record_stop run1
		info run1 end
		stop_redis run1
		;;
	# Run 2: faultscope attached across the BGSAVE: its automatic phases
	# must show the fork and the child's exit. INFO before attaching and
	# after detaching brackets the window for total_forks.
	run2)
		start_redis run2
		info run2 before
		record_start run2
		bgsave run2
		bench run2
		record_stop run2
		info run2 end
		stop_redis run2
		;;
	# COW during a save: the child slowed to COW_SAVE_DELAY_US a key
	# (rdb-key-save-delay), SETs while it saves, which must end before it
	# does (@@FS-SAVING-AFTER-SETS 1): the child's last measure of its
	# private dirty memory (rdb_last_cow_size) then follows every copy.
	cow)
		start_redis cow
		info cow before
		cli CONFIG SET rdb-key-save-delay ${COW_SAVE_DELAY_US:-20} > /dev/null
		record_start cow
		t0=$(uptime_s)
		r=$(cli BGSAVE)
		bench cow ${COW_REQUESTS:-10000}
		echo "@@FS-SAVING-AFTER-SETS cow $(info_field persistence rdb_bgsave_in_progress)"
		# Polled each second: each poll is a few processes, which the
		# oracle counts.
		n=0
		until bgsave_done; do
			n=$((n + 1))
			[ $n -gt 300 ] && fail "cow: BGSAVE did not end"
			sleep 1
		done
		t1=$(uptime_s)
		echo "@@FS-BGSAVE cow $t0 $t1 $r"
		record_stop cow
		info cow end
		stop_redis cow
		;;
	# Run 1 on 64K mTHP: Redis keeps THP on for itself (disable-thp no), so
	# its heap gets 64K folios, which the kernel reuses after the BGSAVE
	# page by page or whole. @@FS-MTHP-ALLOC: 64K folios allocated in all.
	mthp)
		thp_mode 64K
		a0=$(stat64k)
		REDIS_ARGS="--disable-thp no"
		start_redis mthp
		bgsave mthp
		info mthp after-bgsave
		record_start mthp
		bench mthp ${MTHP_REQUESTS:-$REQUESTS}
		record_stop mthp
		info mthp end
		stop_redis mthp
		echo "@@FS-MTHP-ALLOC mthp $(($(stat64k) - a0))"
		REDIS_ARGS=
		thp_mode 4K
		;;
	esac
done
up done
