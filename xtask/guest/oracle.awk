# The independent oracle: tracefs kprobe events (not BPF), counted per
# process from its exec on, with the same per-thread windows the kernel
# runs: handle_mm_fault entry .. return.
#
# Input: /sys/kernel/tracing/trace with options/record-tgid, events
#   fso/hmf  (handle_mm_fault entry: flags, regs as decimals)
#   fso/hmfr (handle_mm_fault return)
#   fso/wp, fso/hwp, fso/nar (do_wp_page, do_huge_pmd_wp_page,
#   folio_add_new_anon_rmap), sched/sched_process_exec.
# Output, per tgid: "oracle TGID faults wp reuse copy huge_pmd_wp".
function field(name,   i, n, kv) {
	n = split($0, kv, " ")
	for (i = 1; i <= n; i++)
		if (index(kv[i], name "=") == 1)
			return substr(kv[i], length(name) + 2)
	return ""
}
{
	if (!match($0, /-[0-9]+ +\( *[0-9-]+\) +\[/))
		next
	s = substr($0, RSTART + 1, RLENGTH - 1)
	gsub(/[()\[]/, " ", s)
	split(s, a, " ")
	pid = a[1]; tgid = a[2]
	if ($0 ~ / sched_process_exec: /) { exec[tgid] = 1; next }
	if (!(tgid in exec)) next
	if ($0 ~ / hmf: /) {
		flags = field("flags") + 0
		regs = field("regs")
		user = (regs != "0" && and(flags, 64) != 0)
		cur[pid] = user; wp[pid] = 0; nar[pid] = 0; hwp[pid] = 0
		if (user) faults[tgid]++
	} else if ($0 ~ / wp: /) {
		if (cur[pid]) wp[pid] = 1
	} else if ($0 ~ / nar: /) {
		if (cur[pid]) nar[pid] = 1
	} else if ($0 ~ / hwp: /) {
		if (cur[pid]) hwp[pid] = 1
	} else if ($0 ~ / hmfr: /) {
		if (cur[pid]) {
			if (wp[pid]) { wpc[tgid]++; if (nar[pid]) copy[tgid]++; else reuse[tgid]++ }
			if (hwp[pid]) huge[tgid]++
		}
		cur[pid] = 0
	}
}
END {
	for (t in faults)
		print "oracle", t, faults[t] + 0, wpc[t] + 0, reuse[t] + 0, copy[t] + 0, huge[t] + 0
}
