# The daemon end to end (`cargo xtask daemon`): Debian's Prometheus scrapes
# `faultscope serve --comm redis-server` in the same guest, across a BGSAVE
# with SETs, then across a restart of Redis under a new pid. The host's
# userspace over 9p, as in redis.sh, whose functions this uses.
#
# Each window lines up four counts of the same faults:
#   Redis stopped (SIGSTOP) -> Prometheus holds a scrape of a serve tick
#   taken after the stop -> query (RUN.before.prom) -> `record -p` attaches
#   -> trace marker "faultscope phase window" -> SIGCONT, BGSAVE during
#   SETs (Redis stopped again while the BGSAVE child exits: hold_child)
#   -> SIGSTOP -> trace marker "faultscope phase quiet" -> record
#   detaches -> the same wait -> query (RUN.after.prom).
# A stopped Redis makes no fault, so the two queries' difference, record's
# report and the oracle's "window" phase must count the same faults.
#
# Env: as redis.sh, and PORT (serve's), TICK (serve's --tick), RECORD_ARGS
# (record's --interval, for the plot), HOLD (seconds of SETs while the
# BGSAVE child is held).
REDIS_FUNCTIONS_ONLY=1 . /redis.sh

PROM=/tmp/prometheus # in the chroot
API=http://127.0.0.1:9090/api/v1
# Every counter of redis-server that the windows compare.
COUNTERS='{__name__=~"faultscope_faults_total|faultscope_class_faults_total|faultscope_forks_total|faultscope_fault_duration_seconds_count",comm="redis-server"}'

http() { in_host /usr/bin/curl -s --max-time 30 "$@"; }
# answers URL: an HTTP 2xx from URL.
answers() { http -f "$1" > /dev/null; }
# serving_or_gone: serve answers, or it has exited.
serving_or_gone() { answers http://127.0.0.1:$PORT/metrics || ! kill -0 $serve 2>/dev/null; }

# promql NAME QUERY: the HTTP API's answer to an instant query, as section
# NAME.
promql() {
	http $API/query --data-urlencode "query=$2" > /tmp/promql.json
	emit "$1" /tmp/promql.json
}

# The timestamp of the last scrape Prometheus holds (Unix seconds).
last_scrape() {
	http $API/query --data-urlencode 'query=timestamp(faultscope_build_info)' |
		sed -n 's/.*"value":\[[^,]*,"\([0-9.]*\)".*/\1/p'
}

# quiet NAME: Redis is stopped. Waits for a scrape at least 4 s after the
# stop (serve answers with its last tick's counts, read every $TICK s; a
# tick, the scrape interval and a slow tick fit in 4 s), then takes every
# counter of redis-server (section NAME.prom).
quiet() {
	t=$(date +%s)
	wait_until 60 scraped_after $t || fail "$1: Prometheus took no scrape within 60 s (last at $(last_scrape), stopped at $t)"
	promql $1.prom "$COUNTERS"
}

# scraped_after T: Prometheus's last scrape is 4 s or more after T.
scraped_after() {
	ts=$(last_scrape) && [ -n "$ts" ] && awk -v a="$ts" -v b="$1" 'BEGIN { exit !(a >= b + 4) }'
}

# Prometheus in the chroot, scraping serve every second, on tmpfs.
prometheus_start() {
	mkdir -p $H$PROM/data
	cat > $H$PROM/prometheus.yml <<-EOF
		global:
		  scrape_interval: 1s
		scrape_configs:
		  - job_name: faultscope
		    static_configs:
		      - targets: ['127.0.0.1:$PORT']
	EOF
	in_host /usr/bin/prometheus --config.file=$PROM/prometheus.yml --storage.tsdb.path=$PROM/data \
		--web.listen-address=127.0.0.1:9090 > /tmp/prometheus.log 2>&1 &
	prom=$!
	wait_until 60 answers http://127.0.0.1:9090/-/ready ||
		{ emit prometheus.log /tmp/prometheus.log; fail "Prometheus not ready within 60 s"; }
	echo "@@FS-PROMETHEUS-VERSION main $(in_host /usr/bin/prometheus --version 2>&1 | head -n 1)"
}

serve_start() {
	skp0=$(grep -c . /sys/kernel/debug/kprobes/list)
	# Every fault timed (serve's default times one in 16): each timed class's
	# histogram _count is compared with record's count, fault for fault.
	# The sampled tier's bound is faultscope_expect::latency_tier's (the
	# host tests' threaded storm in the foundation guest).
	/faultscope serve --comm redis-server --latency all --port $PORT --tick $TICK > /tmp/serve.out 2>&1 &
	serve=$!
	if ! wait_until 120 serving_or_gone || ! answers http://127.0.0.1:$PORT/metrics; then
		emit serve.out /tmp/serve.out
		fail "faultscope serve did not answer within 120 s"
	fi
	up serve-up
}

# traced RUN: waits until serve traces redis-server $pid.
traced() {
	wait_until 30 grep -q "tracing pid $pid " /tmp/serve.out ||
		{ emit serve.out /tmp/serve.out; fail "$1: serve did not pick up redis-server $pid"; }
	up "$1.traced"
}

# freeze: SIGSTOP to redis-server, and wait until each of its threads has
# stopped (a thread in a fault finishes it first).
freeze() {
	kill -STOP $pid
	wait_until 5 all_stopped || fail "redis-server $pid did not stop"
}

all_stopped() {
	for s in /proc/$pid/task/*/stat; do
		case $(state_of $s) in
		T | t) ;;
		*) return 1 ;;
		esac
	done
}

# state_of STAT: the state letter of a /proc stat file (nothing if gone);
# state PID: that of PID.
state_of() { sed 's/.*) //' $1 2>/dev/null | cut -d' ' -f1; }
state() { state_of /proc/$1/stat; }
stopped_or_exited() { case $(state $1) in T | t | Z | '') ;; *) return 1 ;; esac; }
exited() { case $(state $1) in Z | '') ;; *) return 1 ;; esac; }

# hold_child RUN (bgsave's THEN): the BGSAVE child held (SIGSTOP) while
# the SETs copy for HOLD seconds, then redis-server frozen while the child
# goes on and exits, then redis-server continued. No fault of redis-server
# can then end between serve's and record's programs at the child's exit,
# so both start the next phase after the same fault. @@FS-HELD RUN yes, or
# no and why (the child was gone before it could be held).
hold_child() {
	child=$(cat /proc/$pid/task/*/children 2>/dev/null | tr ' ' '\n' | grep . | head -n 1)
	[ -n "$child" ] && kill -STOP $child 2>/dev/null && wait_until 5 stopped_or_exited $child
	case $(state ${child:-0}) in
	T | t)
		sleep $HOLD
		freeze
		kill -CONT $child
		wait_until 120 exited $child || fail "$1: the BGSAVE child $child did not exit"
		kill -CONT $pid
		echo "@@FS-HELD $1 yes"
		;;
	*) echo "@@FS-HELD $1 no: the BGSAVE child (${child:-none found}) had exited before SIGSTOP" ;;
	esac
}

# window RUN: a fresh redis-server, loaded; then the window above.
window() {
	start_redis $1
	traced $1
	info $1 before
	freeze
	quiet $1.before
	up "$1.quiet-before"
	record_start $1
	echo "faultscope phase window" > $T/trace_marker
	kill -CONT $pid
	# The SETs run while the BGSAVE child lives (COW copies) and after it
	# has exited (reuse).
	bench $1 &
	b=$!
	bgsave $1 hold_child
	wait $b
	# The last clients' teardown, inside the window.
	sleep 0.3
	freeze
	echo "faultscope phase quiet" > $T/trace_marker
	record_stop $1
	quiet $1.after
	up "$1.quiet-after"
	kill -CONT $pid
	info $1 end
}

# A scrape as a scraper without OpenMetrics gets it, checked by promtool,
# and as OpenMetrics (what Prometheus asks for).
scrapes() {
	http http://127.0.0.1:$PORT/metrics > $H/tmp/scrape.prom
	in_host /usr/bin/promtool check metrics < $H/tmp/scrape.prom > /tmp/promtool.out 2>&1
	echo "@@FS-PROMTOOL main $?"
	http -H 'Accept: application/openmetrics-text; version=1.0.0' http://127.0.0.1:$PORT/metrics > /tmp/scrape.om
	emit scrape.prom $H/tmp/scrape.prom
	emit scrape.om /tmp/scrape.om
	emit promtool.out /tmp/promtool.out
}

up boot
host_root
ip link set lo up || ifconfig lo 127.0.0.1 up || fail "loopback up"
up host-root
echo "@@FS-REDIS-VERSION main $(in_host /usr/bin/redis-server --version)"
echo 1 > /proc/sys/vm/overcommit_memory
oracle_setup
thp_mode 4K
prometheus_start
up prometheus-up
serve_start

window run1
scrapes
# Restart: the next redis-server has a new pid; serve finds it by name.
stop_redis run1
window run2
stop_redis run2

# The whole run, as a dashboard would ask: counter resets (none: the
# counters only grow across the restart), the README's two queries, and
# whether Prometheus saw the target up.
promql end.resets 'resets({__name__=~"faultscope_faults_total|faultscope_class_faults_total",comm="redis-server"}[1h])'
promql end.copies-per-bgsave 'sum by (comm) (increase(faultscope_faults_total{kind="copy", phase_kind="child-alive"}[1h])) / sum by (comm) (increase(faultscope_forks_total[1h]))'
promql end.p99 'histogram_quantile(0.99, sum by (class, le) (rate(faultscope_fault_duration_seconds_bucket[5m])))'
promql end.up 'up{job="faultscope"}'
kill -TERM $serve
wait $serve
echo "@@FS-SERVE-RC main $?"
skp1=$(grep -c . /sys/kernel/debug/kprobes/list)
echo "@@FS-KPROBES-LEFT serve $((skp1 - skp0))"
kill -TERM $prom
wait $prom
emit serve.out /tmp/serve.out
up done
